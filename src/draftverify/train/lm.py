"""`draftverify train lm`: train a small causal LM (``LlamaForCausalLM``) from scratch on the code corpus.

The recipe on top of the shared run (train/runner.py, on transformers' Trainer: the schedule, budgets, checkpoints
and resume):

* the corpus splits come from the token cache (train/tokens.py); training samples random windows of
  ``seq_len + 1`` tokens, the held-out loss is measured on a fixed, evenly spaced set of validation windows;
* the model is a preset (train/presets.py), the architecture of an existing checkpoint, or ``--init-from`` an
  exported model (fresh optimizer);
* ``--early-exit-layer L``: the last ``early_exit_share`` of the run (same schedule) trains with BiLD section
  4.4's averaged loss of layer L and the last layer (train/losses.py, as the zoo's GPU recipe does); the
  weights from before that phase are kept on disk and exported instead when the full model's held-out loss
  rose by more than ``max_degradation`` nats in it;
* at the end the model is exported in fp16 safetensors with the tokenizer and a model card (train/lm_card.py).
"""

from __future__ import annotations

import json
from dataclasses import KW_ONLY, field
from pathlib import Path
from typing import Callable, Optional

from ..bench.environment import command_line, cpu_model
from ..options.declare import option
from . import corpus as corpus_mod
from .export import export_model
from .lm_card import model_card
from .losses import autocast, averaged_loss, evaluate, held_out_losses, lm_loss, next_token_losses
from .presets import PRESETS, count_params, make_config
from .runner import Run, load_checkpoint
from .settings import RunOptions, TrainError, seed_everything, set_threads
from .shared_flags import OWN_DATA, recipe_options, shared
from .tokenizer import tokenizer_hash
from .tokens import check_corpus_inputs, load_corpus, sample_batch


@recipe_options
class TrainOptions(RunOptions):
    """`train lm`'s options, each its flag (the run options' too: RunOptions)."""

    out_dir: str = shared(...)
    tokenizer: str = shared("zoo/code/tokenizer", "Tokenizer directory.")
    manifest: str = shared("zoo/code/manifest.json")
    data: Optional[str] = shared(None, OWN_DATA)  # read as the manifest (the command does)
    preset: str = shared("target", "Architecture preset: target | draft (| tiny).")
    export_dir: Optional[str] = shared(None)  # default: out_dir/export
    cache_dir: Optional[str] = shared(None)  # default: out_dir/../token-cache
    init_from: Optional[str] = shared(None)
    seq_len: int = shared(512)
    val_windows: int = shared(64)
    config_overrides: dict = field(default_factory=dict)
    export: bool = True
    early_exit_layer: Optional[int] = option(
        None, "--early-exit-layer", "End the run with BiLD 4.4's averaged loss of this layer and the last."
    )
    early_exit_share: float = option(0.2, "--early-exit-share", "Share of the run in that phase.")
    max_degradation: float = shared(
        0.03, "Drop the phase's weights if the full model's held-out loss rose more (nats)."
    )
    _: KW_ONLY
    lr: float = shared(8e-4)
    eval_minutes: Optional[float] = shared(10.0)  # eval_every_steps (RunOptions) overrides it when set

    def validate(self) -> None:
        if self.preset not in PRESETS and self.init_from is None:
            raise TrainError(f"unknown preset {self.preset!r}; choose one of: {', '.join(PRESETS)}")
        for name in ("seq_len", "val_windows"):
            if getattr(self, name) <= 0:
                raise TrainError(f"--{name.replace('_', '-')} must be positive")
        if self.early_exit_layer is not None:
            if self.early_exit_layer < 1:
                raise TrainError(f"--early-exit-layer must be >= 1, got {self.early_exit_layer}")
            if not 0 < self.early_exit_share < 1:
                raise TrainError(f"--early-exit-share must be in (0, 1), got {self.early_exit_share}")
            if self.max_degradation < 0:
                raise TrainError(f"--max-degradation must be >= 0 nats, got {self.max_degradation}")
        self.validate_run()
        check_corpus_inputs(self.tokenizer, self.manifest)
        if self.init_from is not None and not (Path(self.init_from) / "config.json").is_file():
            raise TrainError(f"--init-from {self.init_from}: no config.json there (expected an exported HF model dir)")


def _build_model(opts: TrainOptions, tok, ckpt: Optional[dict]):
    """The checkpoint's architecture when resuming, else --init-from's weights, else a fresh preset."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if ckpt is not None:
        model = LlamaForCausalLM(LlamaConfig.from_dict(ckpt["config"]))
    elif opts.init_from:
        model = LlamaForCausalLM.from_pretrained(opts.init_from, dtype=torch.float32)
        if model.config.vocab_size != len(tok):
            raise TrainError(f"--init-from model vocab {model.config.vocab_size} != tokenizer vocab {len(tok)}")
    else:
        model = LlamaForCausalLM(make_config(opts.preset, len(tok), tok.eos_token_id, **opts.config_overrides))
    if opts.seq_len > model.config.max_position_embeddings:
        raise TrainError(
            f"--seq-len {opts.seq_len} exceeds max_position_embeddings {model.config.max_position_embeddings}"
        )
    layers = model.config.num_hidden_layers
    if opts.early_exit_layer is not None and opts.early_exit_layer >= layers:
        raise TrainError(
            f"--early-exit-layer must be in [1, {layers - 1}] for this {layers}-layer model, got "
            f"{opts.early_exit_layer}"
        )
    model.config._attn_implementation = "sdpa"
    return model


def train(opts: TrainOptions, log: Callable[[str], None] = print, stop_after_steps: Optional[int] = None) -> dict:
    """Run (or resume) a training run.  Returns a summary dict.

    ``stop_after_steps`` interrupts this invocation after that many optimizer
    steps (checkpointing, no export) -- used to test resume.
    """
    opts.validate()
    import torch
    from transformers import __version__ as tf_version

    set_threads(opts.threads)
    out_dir = Path(opts.out_dir)
    export_dir = Path(opts.export_dir) if opts.export_dir else out_dir / "export"
    cache_dir = Path(opts.cache_dir) if opts.cache_dir else out_dir.parent / "token-cache"
    command = opts.command or command_line()
    data = load_corpus(opts.tokenizer, opts.manifest, str(cache_dir), opts.seq_len, opts.val_windows, log=log)
    tok, manifest = data.tok, data.manifest

    seed_everything(opts.seed)
    ckpt = load_checkpoint(out_dir)
    model = _build_model(opts, tok, ckpt).to(opts.torch_device())
    n_params = count_params(model)
    run = Run(
        model,
        opts,
        out_dir,
        batches=lambda rng: sample_batch(data.train, rng, opts.batch_size, opts.seq_len),
        loss=lambda m, x: lm_loss(m, x, run.bf16),
        evaluate=lambda m: evaluate(m, data.val_windows, run.bf16, opts.batch_size, run.device),
        counts=lambda x: {"tokens_seen": opts.batch_size * opts.seq_len},
        state={"tokens_seen": 0, "preset": opts.preset, "init_from": opts.init_from},
        checkpoint=ckpt,
        log=log,
    )
    del ckpt
    log(
        f"model: {opts.preset if not opts.init_from else 'init-from ' + opts.init_from} | "
        f"{n_params:,} params | seq {opts.seq_len} x batch {opts.batch_size} | lr {opts.lr} | "
        f"{'bf16 autocast' if run.bf16 else 'fp32'} | threads {torch.get_num_threads()} | "
        f"train {len(data.train):,} tok / val {len(data.val):,} tok ({len(data.val_windows)} val windows)"
    )
    if opts.early_exit_layer is None:
        state = run.fit(stop_after_steps)
    else:
        state = _fit_with_early_exit_phase(run, opts, data.val_windows, stop_after_steps, log)
    if state["stopped"]:
        return {"step": state["step"], "stopped": True, "params": n_params, "out_dir": str(out_dir)}

    val = state["val_loss"]
    info = {
        "preset": opts.preset if not opts.init_from else f"{opts.preset} (init from {opts.init_from})",
        "params": n_params,
        "config": model.config.to_dict(),
        "python_version": manifest.get("python_version", "?"),
        "manifest_counts": manifest.get("counts", {}),
        "manifest_skipped": len(manifest.get("skipped", [])),
        "manifest_hash": corpus_mod.manifest_hash(manifest),
        "manifest": opts.manifest,
        "tokenizer_hash": tokenizer_hash(opts.tokenizer),
        "train_tokens": int(len(data.train)),
        "val_tokens": int(len(data.val)),
        "command": "\n".join(state["commands"]) if state["resumes"] else command,
        "seq_len": opts.seq_len,
        "batch_size": opts.batch_size,
        **opts.optimizer_settings(),
        "seed": opts.seed,
        "step": state["step"],
        "tokens_seen": state["tokens_seen"],
        "elapsed": state["elapsed"],
        "threads": torch.get_num_threads(),
        "cpu": cpu_model(),
        "tokens_per_s": state["tokens_seen"] / max(state["elapsed"], 1e-9),
        "init_from": state.get("init_from"),
        "resumes": state["resumes"],
        "val_loss": val,
        "val_windows": len(data.val_windows),
        "bf16": run.bf16,
        "torch": torch.__version__,
        "transformers": tf_version,
        "early_exit": state.get("early_exit"),
    }
    summary = {k: v for k, v in info.items() if k != "config"}
    summary["out_dir"] = str(out_dir)
    if opts.export and run.is_main:
        export_model(model, tok, export_dir, model_card(info))
        (export_dir / "training_summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
        summary["export_dir"] = str(export_dir)
        log(f"exported fp16 model to {export_dir}")
    return summary


SNAPSHOT = "before-early-exit.pt"


def _fit_with_early_exit_phase(
    run: Run, opts: TrainOptions, windows, stop_after_steps: Optional[int], log: Callable[[str], None]
) -> dict:
    """Plain LM loss up to 1 - early_exit_share of the run, then BiLD's averaged loss to the end (one
    schedule). The weights at the switch are saved next to the checkpoint and put back when the full model's
    held-out loss rose by more than max_degradation; the figures go to state["early_exit"]."""
    import torch

    layer, model, start = opts.early_exit_layer, run.model, run.state["step"]
    state = run.fit(stop_after_steps, until=1.0 - opts.early_exit_share)
    if state["stopped"]:
        return state
    snapshot = run.run_dir / SNAPSHOT
    if run.state.get("early_exit") is None:
        full, early = held_out_losses(model, windows, run.bf16, opts.batch_size, layer, run.device)
        torch.save(model.state_dict(), snapshot)
        run.state["early_exit"] = {
            "layer": layer,
            "from_step": run.state["step"],
            "before": {"full": full, "early": early},
        }
        log(
            f"early-exit phase from step {run.state['step']} (layer {layer}): held-out loss full {full:.4f} | "
            f"layer {layer} {early:.4f}"
        )

    def joint(m, x):
        with autocast(run.bf16):
            return averaged_loss(*next_token_losses(m, x, layer))

    run.loss = joint
    left = None if stop_after_steps is None else stop_after_steps - (run.state["step"] - start)
    state = run.fit(left)
    if state["stopped"]:
        return state
    ee = state["early_exit"]
    full, early = held_out_losses(model, windows, run.bf16, opts.batch_size, layer, run.device)
    ee["after"] = {"full": full, "early": early}
    ee["max_degradation"] = opts.max_degradation
    ee["kept"] = full <= ee["before"]["full"] + opts.max_degradation
    log(
        f"early-exit phase: held-out loss full {ee['before']['full']:.4f} -> {full:.4f} | layer {layer} "
        f"{ee['before']['early']:.4f} -> {early:.4f} | "
        + ("kept" if ee["kept"] else f"dropped (more than {opts.max_degradation} nats)")
    )
    if not ee["kept"]:
        model.load_state_dict(torch.load(snapshot, map_location="cpu"))
        state["val_loss"] = ee["before"]["full"]
    return state

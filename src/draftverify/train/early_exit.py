"""`draftverify train early-exit`: make a target's first L layers a useful small model (BiLD section 4.4).

The target is fine-tuned on the corpus with the average of its last layer's next-token loss and layer L's (layer
L's hidden state through the model's own final norm and LM head, as the `early_exit` drafter runs it; the loss
is train/losses.py's, the one the zoo's GPU recipe trains with). Both held-out losses are measured
on the fixed validation windows of `train lm` before and after. Training for the early layer costs the full
model some quality, so the result is exported only when the full model's held-out loss rose by at most
``max_degradation`` nats (``force`` exports anyway): a target that got worse would slow down every method,
not only early exit.
"""

from __future__ import annotations

import json
from dataclasses import KW_ONLY
from pathlib import Path
from typing import Callable, Optional

from ..bench.environment import command_line, cpu_model
from ..markdown import command_block, markdown_table
from ..options.declare import option
from .export import export_model
from .losses import autocast, averaged_loss, held_out_losses, next_token_losses
from .presets import count_params
from .runner import Run
from .settings import RunOptions, TrainError, seed_everything, set_threads
from .shared_flags import OWN_DATA, recipe_options, shared
from .tokens import check_corpus_inputs, load_corpus, sample_batch


class DegradedError(TrainError):
    """The full model's held-out loss rose by more than the allowed bound: nothing was exported."""


@recipe_options
class EarlyExitOptions(RunOptions):
    """`train early-exit`'s options, each its flag (the run options' too: RunOptions)."""

    layer: int = option(..., "--layer", "Early-exit layer L: the first L layers form the small model.")
    out_dir: str = shared(..., "Where to export the fine-tuned target.")
    target: str = shared("zoo/code/target")
    work_dir: str = shared("runs/early-exit")  # checkpoint, log.jsonl, early_exit.json
    manifest: str = shared("zoo/code/manifest.json")
    data: Optional[str] = shared(None, OWN_DATA)  # read as the manifest (the command does)
    tokenizer: Optional[str] = shared(None)  # default: the target's directory
    cache_dir: Optional[str] = shared(None, "Token cache directory (default: <work-dir>/../token-cache).")
    seq_len: int = shared(512)
    val_windows: int = shared(64)
    max_degradation: float = shared(0.03)  # nats/token the full model may lose on the held-out windows
    force: bool = option(False, "--force", "Export even when the full model degraded more.")
    _: KW_ONLY
    lr: float = shared(1e-4)
    warmup_steps: int = shared(20)

    @property
    def tokenizer_dir(self) -> str:
        return self.tokenizer or self.target

    def validate(self) -> int:
        """Check every input before anything slow starts; returns the target's layer count."""
        cfg_path = Path(self.target) / "config.json"
        if not cfg_path.is_file():
            raise TrainError(
                f"--target {self.target}: no config.json there (expected an exported model, as written by `train lm`)"
            )
        cfg = json.loads(cfg_path.read_text())
        layers = cfg.get("num_hidden_layers")
        if not isinstance(layers, int) or layers < 2:
            raise TrainError(f"--target {self.target} has {layers} layers; early exit needs at least 2")
        if not 1 <= self.layer < layers:
            raise TrainError(f"--layer must be in [1, {layers - 1}] for this {layers}-layer target, got {self.layer}")
        for name in ("seq_len", "val_windows"):
            if getattr(self, name) <= 0:
                raise TrainError(f"--{name.replace('_', '-')} must be positive")
        if self.max_degradation < 0:
            raise TrainError(f"--max-degradation must be >= 0 nats, got {self.max_degradation}")
        self.validate_run()
        check_corpus_inputs(self.tokenizer_dir, self.manifest)
        return layers


def early_exit_card(info: dict) -> str:
    b, a = info["before"], info["after"]
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: text-generation",
        "license: apache-2.0",
        "tags: [draftverify, code, python, llama, speculative-decoding, bild, early-exit]",
        "---",
        "",
        f"# draftverify code target with an early exit at layer {info['layer']} ({info['params'] / 1e6:.2f}M "
        "parameters)",
        "",
        f"`{info['target']}` fine-tuned by `draftverify train early-exit` with BiLD's averaged loss (Kim et al., "
        f"Big Little Decoder, section 4.4): the mean of the last layer's next-token loss and layer "
        f"{info['layer']}'s, read through the model's own final norm and LM head. Its first {info['layer']} "
        f"layers are the small model of `draftverify generate --method early_exit --early-exit-layers "
        f"{info['layer']}` (shared weights, no second model).",
        "",
        "## Held-out loss (nats/token)",
        "",
        f"On {info['val_windows']} fixed windows of {info['seq_len']} tokens of the corpus validation split.",
        "",
        *markdown_table(
            ("", "full model", f"layer {info['layer']}"),
            [(name, f"{s['full']:.4f}", f"{s['early']:.4f}") for name, s in (("before", b), ("after (this model)", a))],
        ),
        "",
        f"The full model's loss changed by {info['degradation']:+.4f} (bound {info['max_degradation']}"
        + ("; exported with --force" if info["degradation"] > info["max_degradation"] else "")
        + ").",
        "",
        *command_block("## Fine-tuning", info["command"], language=""),
        "",
        f"- {info['step']:,} steps of {info['batch_size']} x {info['seq_len']} tokens ({info['tokens_seen']:,} "
        f"tokens), AdamW (betas {info['betas']}, weight decay {info['weight_decay']}), peak LR {info['lr']}, "
        f"{info['warmup_steps']} warmup steps, cosine decay to {info['min_lr_ratio']}x, grad clip "
        f"{info['grad_clip']}, " + ("bf16 autocast" if info["bf16"] else "float32") + ".",
        f"- {info['elapsed'] / 60:.1f} min on {info['threads']} CPU thread(s) ({info['cpu']}); resumed "
        f"{info['resumes']} time(s).",
        "- Weights exported in float16 (safetensors) with the target's tokenizer.",
        "",
    ]
    return "\n".join(lines)


def train_early_exit(
    opts: EarlyExitOptions, log: Callable[[str], None] = print, stop_after_steps: Optional[int] = None
) -> dict:
    """Run (or resume) the fine-tune; returns the report written to early_exit.json (also when refused).

    Raises DegradedError (after writing the report to the work dir) when the full model's held-out loss rose by
    more than opts.max_degradation and not opts.force. ``stop_after_steps`` interrupts this call (a test hook).
    """
    opts.validate()
    import torch
    from transformers import AutoModelForCausalLM

    from .align import model_digest

    set_threads(opts.threads)
    work = Path(opts.work_dir)
    cache_dir = opts.cache_dir or str(work.parent / "token-cache")
    data = load_corpus(opts.tokenizer_dir, opts.manifest, cache_dir, opts.seq_len, opts.val_windows, log=log)
    seed_everything(opts.seed)
    model = AutoModelForCausalLM.from_pretrained(opts.target, dtype=torch.float32).to(opts.torch_device())
    if model.config.vocab_size < len(data.tok):
        raise TrainError(
            f"the tokenizer has {len(data.tok)} tokens but the target's vocab_size is {model.config.vocab_size}"
        )
    if opts.seq_len > model.config.max_position_embeddings:
        raise TrainError(
            f"--seq-len {opts.seq_len} exceeds the target's max_position_embeddings "
            f"{model.config.max_position_embeddings}"
        )
    model.config._attn_implementation = "sdpa"
    target_sha = model_digest(opts.target)
    layer = opts.layer

    def loss(m, x):
        with autocast(run.bf16):
            return averaged_loss(*next_token_losses(m, x, layer))

    run = Run(
        model,
        opts,
        work,
        name="early-exit",
        log=log,
        batches=lambda rng: sample_batch(data.train, rng, opts.batch_size, opts.seq_len),
        loss=loss,
        evaluate=lambda m: held_out_losses(m, data.val_windows, run.bf16, opts.batch_size, device=run.device)[0],
        counts=lambda x: {"tokens_seen": opts.batch_size * opts.seq_len},
        state={"tokens_seen": 0, "target_sha256": target_sha, "layer": layer, "before": None},
    )
    state = run.state
    if state["target_sha256"] != target_sha or state["layer"] != layer:
        raise TrainError(
            f"the checkpoint in {work} belongs to another target or --layer; delete it or use another --work-dir"
        )

    def both() -> dict:
        full, early = held_out_losses(model, data.val_windows, run.bf16, opts.batch_size, layer, run.device)
        return {"full": full, "early": early}

    if state["before"] is None:
        state["before"] = both()
        log(
            f"early-exit: held-out loss before: full model {state['before']['full']:.4f} | layer {layer} "
            f"{state['before']['early']:.4f}"
        )
    result = run.fit(stop_after_steps)
    if result["stopped"]:
        return {"stopped": True, "step": result["step"], "work_dir": str(work)}
    before, after = result["before"], both()
    degradation = after["full"] - before["full"]
    info = {
        "target": str(opts.target),
        "target_sha256": target_sha,
        "layer": layer,
        "before": before,
        "after": after,
        "degradation": degradation,
        "max_degradation": opts.max_degradation,
        "exported": degradation <= opts.max_degradation or opts.force,
        "out_dir": str(opts.out_dir),
        "command": "\n".join(result["commands"]) if result["resumes"] else (opts.command or command_line()),
        "params": count_params(model),
        "step": result["step"],
        "tokens_seen": result["tokens_seen"],
        "elapsed": result["elapsed"],
        "resumes": result["resumes"],
        "seq_len": opts.seq_len,
        "batch_size": opts.batch_size,
        "val_windows": len(data.val_windows),
        **opts.optimizer_settings(),
        "bf16": run.bf16,
        "threads": torch.get_num_threads(),
        "cpu": cpu_model(),
    }
    text = json.dumps(info, indent=1, default=str) + "\n"
    (work / "early_exit.json").write_text(text)
    log(
        f"early-exit: held-out loss full model {before['full']:.4f} -> {after['full']:.4f} "
        f"({degradation:+.4f}) | layer {layer} {before['early']:.4f} -> {after['early']:.4f}"
    )
    if not info["exported"]:
        raise DegradedError(
            f"the full model's held-out loss rose by {degradation:.4f} nats ({before['full']:.4f} -> "
            f"{after['full']:.4f}), more than --max-degradation {opts.max_degradation}; not exported (report in "
            f"{work / 'early_exit.json'}; --force exports anyway, or lower --lr / fewer steps)"
        )
    out = Path(opts.out_dir)
    export_model(model, data.tok, out, early_exit_card(info))
    (out / "early_exit.json").write_text(text)
    log(f"exported the fine-tuned target (fp16) to {out}")
    return info

"""Train a small causal LM (``LlamaForCausalLM``) from scratch on the code corpus.

Design:

* the corpus (train / val split of the manifest) is tokenized once into a flat
  ``uint16`` array (documents joined with the eos token) cached on disk under
  ``cache_dir/<manifest-hash>-<tokenizer-hash>/``;
* training samples random windows of ``seq_len + 1`` tokens; the held-out loss
  is measured on a fixed, evenly spaced set of validation windows;
* AdamW + linear warmup + cosine decay.  The decay runs over the *progress*
  ``max(step / max_steps, elapsed / budget)`` so a wall-clock budget gets a full
  schedule;
* a checkpoint (model, optimizer, scheduler, step, RNG states, elapsed seconds)
  is written every ``checkpoint_minutes`` to ``out_dir/checkpoint/`` and picked
  up automatically when the same command is run again;
* at the end the model is exported in fp16 safetensors together with the
  tokenizer and a model card.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import platform
import random
import shlex
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from . import corpus as corpus_mod
from .tokenizer import TokenizerError, load_tokenizer, tokenizer_hash


class TrainError(RuntimeError):
    """User-facing training error (bad arguments, missing inputs...)."""


# --------------------------------------------------------------------------- presets

# Architecture presets (vocab_size is filled in from the tokenizer).
PRESETS: dict[str, dict[str, Any]] = {
    # ~52.5M parameters with an 8192 vocab (tied embeddings); fp16 export ~105 MB. 14x the draft (the papers use
    # 10-150x); ~1.8x the per-token cost of the first zoo's 29.9M target on CPU, for a far lower loss.
    "target": dict(
        hidden_size=576, num_hidden_layers=12, num_attention_heads=9, num_key_value_heads=9,
        intermediate_size=1536, max_position_embeddings=2048,
    ),
    # ~3.8M parameters with an 8192 vocab (tied embeddings). Two layers, not four: on CPU a decode step costs
    # ~0.11 of the target's with 2 layers vs ~0.25 with 4 (measured, 1 thread), and Theorem 8 rewards low c.
    "draft": dict(
        hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        intermediate_size=768, max_position_embeddings=2048,
    ),
    # for tests / smoke checks only
    "tiny": dict(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        intermediate_size=64, max_position_embeddings=512,
    ),
}

# Measured on the dev box (AMD EPYC with avx512_bf16, 1 thread, target preset, seq 512,
# fwd+bwd+AdamW, `draftverify train bench`): bf16 autocast is ~2.5-3x faster than fp32.
BF16_MEASUREMENT = (
    "target preset, 1 thread: batch 4x512 fp32 4.78-5.02 s/step (408-429 tok/s) vs bf16 1.68-2.03 s/step "
    "(1009-1216 tok/s); batch 8x512 fp32 10.1-10.6 s/step (387-407 tok/s) vs bf16 3.34-4.19 s/step "
    "(979-1228 tok/s). draft preset batch 8x512: fp32 1.62 s/step vs bf16 0.70 s/step."
)
DEFAULT_BF16 = True  # bf16 autocast (fp32 master weights/optimizer) measured faster; --no-bf16 to disable


def make_config(preset: str, vocab_size: int, eos_id: int, **overrides):
    from transformers import LlamaConfig

    if preset not in PRESETS:
        raise TrainError(f"unknown preset {preset!r}; choose one of: {', '.join(PRESETS)}")
    kw = dict(PRESETS[preset])
    kw.update({k: v for k, v in overrides.items() if v is not None})
    return LlamaConfig(
        vocab_size=vocab_size,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        attention_dropout=0.0,
        tie_word_embeddings=True,
        initializer_range=0.02,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        # no pad_token_id in the model config: nn.Embedding(padding_idx=...) would freeze the
        # input embedding of <|endoftext|>, which is also the document separator.  Padding is
        # declared in the tokenizer and in generation_config instead.
        pad_token_id=None,
        use_cache=True,
        **kw,
    )


def count_params(model) -> int:
    """Unique parameters (tied embeddings counted once)."""
    seen, n = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            n += p.numel()
    return n


# --------------------------------------------------------------------------- options


@dataclass(kw_only=True)
class OptimOptions:
    """Optimizer (``make_optimizer``), schedule (``WarmupCosine``) and run settings shared by
    ``TrainOptions`` and ``align.AlignOptions``.  Keyword-only, so a subclass can redeclare one to
    change its default."""

    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    max_steps: Optional[int] = None
    max_minutes: Optional[float] = None
    threads: Optional[int] = None
    bf16: Optional[bool] = None             # None -> DEFAULT_BF16
    checkpoint_minutes: float = 10.0
    log_every: int = 10
    progress: Optional[bool] = None         # None -> tqdm bar(s) iff stderr is a tty
    command: Optional[str] = None           # recorded in the model card


@dataclass
class TrainOptions(OptimOptions):
    tokenizer: str
    manifest: str
    out_dir: str
    preset: str = "target"
    export_dir: Optional[str] = None        # default: out_dir/export
    cache_dir: Optional[str] = None         # default: out_dir/../token-cache
    init_from: Optional[str] = None
    seq_len: int = 512
    batch_size: int = 8
    seed: int = 1234
    eval_minutes: float = 10.0
    eval_every_steps: Optional[int] = None  # overrides eval_minutes when set
    val_windows: int = 64
    config_overrides: dict = field(default_factory=dict)
    export: bool = True

    def validate(self) -> None:
        if self.preset not in PRESETS and self.init_from is None:
            raise TrainError(f"unknown preset {self.preset!r}; choose one of: {', '.join(PRESETS)}")
        for name in ("seq_len", "batch_size", "log_every", "val_windows"):
            if getattr(self, name) <= 0:
                raise TrainError(f"--{name.replace('_', '-')} must be positive")
        if self.lr <= 0:
            raise TrainError("--lr must be positive")
        if self.max_steps is None and self.max_minutes is None:
            raise TrainError("give --max-steps and/or --max-minutes")
        if self.max_steps is not None and self.max_steps <= 0:
            raise TrainError("--max-steps must be positive")
        if self.max_minutes is not None and self.max_minutes <= 0:
            raise TrainError("--max-minutes must be positive")
        if self.threads is not None and self.threads <= 0:
            raise TrainError("--threads must be positive")
        if not Path(self.manifest).is_file():
            raise TrainError(f"manifest {self.manifest} not found (run `draftverify train tokenizer` first)")
        tdir = Path(self.tokenizer)
        if not (tdir / "tokenizer.json").is_file():
            raise TrainError(
                f"tokenizer directory {tdir} not found or has no tokenizer.json "
                "(run `draftverify train tokenizer` first)"
            )
        if self.init_from is not None and not (Path(self.init_from) / "config.json").is_file():
            raise TrainError(f"--init-from {self.init_from}: no config.json there (expected an exported HF model dir)")


# --------------------------------------------------------------------------- data


def _cache_key(manifest: dict, tok_dir: str) -> str:
    return f"{corpus_mod.manifest_hash(manifest)[:16]}-{tokenizer_hash(tok_dir)[:16]}"


def tokenize_split(manifest: dict, tok, split: str, eos_id: int) -> np.ndarray:
    """Tokenize all files of a split into one flat uint16 array, eos-joined."""
    backend = tok.backend_tokenizer
    parts: list[np.ndarray] = []
    eos = np.array([eos_id], dtype=np.uint16)
    for text in corpus_mod.iter_texts(manifest, split):
        ids = backend.encode(text, add_special_tokens=False).ids
        parts.append(np.asarray(ids, dtype=np.uint16))
        parts.append(eos)
    if not parts:
        return np.zeros(0, dtype=np.uint16)
    return np.concatenate(parts)


def load_token_cache(manifest: dict, tok_dir: str, tok, cache_dir: str, log=print) -> dict[str, np.ndarray]:
    """Return {"train": arr, "val": arr}, tokenizing once and caching as .npy."""
    if len(tok) > 65535:
        raise TrainError("vocabulary too large for the uint16 token cache")
    d = Path(cache_dir) / _cache_key(manifest, tok_dir)
    d.mkdir(parents=True, exist_ok=True)
    out = {}
    for split in ("train", "val"):
        f = d / f"{split}.u16.npy"
        if not f.is_file():
            t0 = time.time()
            arr = tokenize_split(manifest, tok, split, tok.eos_token_id)
            tmp = d / f"{split}.u16.tmp.npy"
            np.save(tmp, arr)
            tmp.replace(f)
            log(f"tokenized {split}: {len(arr):,} tokens in {time.time() - t0:.1f}s -> {f}")
        out[split] = np.load(f, mmap_mode="r")
    meta = d / "meta.json"
    if not meta.is_file():
        meta.write_text(json.dumps({
            "manifest_files_sha256": corpus_mod.manifest_hash(manifest),
            "tokenizer_sha256": tokenizer_hash(tok_dir),
            "tokens": {k: int(len(v)) for k, v in out.items()},
        }, indent=1) + "\n")
    return out


def sample_batch(data: np.ndarray, rng: np.random.Generator, batch_size: int, seq_len: int):
    import torch

    n = len(data) - seq_len - 1
    starts = rng.integers(0, n + 1, size=batch_size)
    x = np.stack([np.asarray(data[s : s + seq_len + 1], dtype=np.int64) for s in starts])
    return torch.from_numpy(x)


def fixed_windows(data: np.ndarray, n_windows: int, seq_len: int):
    """Evenly spaced, non-overlapping (when possible) windows of the val split."""
    import torch

    n = len(data) - seq_len - 1
    if n < 0:
        raise TrainError(f"validation split has only {len(data)} tokens; need > seq_len ({seq_len})")
    k = max(1, min(n_windows, n // (seq_len + 1) + 1))
    starts = np.linspace(0, n, num=k).astype(np.int64)
    x = np.stack([np.asarray(data[s : s + seq_len + 1], dtype=np.int64) for s in starts])
    return torch.from_numpy(x)


# --------------------------------------------------------------------------- optimizer / schedule


def make_optimizer(model, lr: float, weight_decay: float, beta1: float, beta2: float):
    """AdamW with weight decay on the matrices (dim >= 2) only, not on norm weights / biases."""
    import torch

    decay, no_decay = [], []
    for _, p in model.named_parameters():
        (decay if p.dim() >= 2 else no_decay).append(p)
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr, betas=(beta1, beta2), eps=1e-8, fused=False,
    )


class WarmupCosine:
    """LR = base * warmup(step) then cosine over progress in [0, 1] down to min_ratio*base."""

    def __init__(self, base_lr: float, warmup_steps: int, min_ratio: float):
        self.base_lr = base_lr
        self.warmup_steps = warmup_steps
        self.min_ratio = min_ratio
        self.last_lr = 0.0
        self.last_progress = 0.0

    def lr(self, step: int, progress: float) -> float:
        if self.warmup_steps > 0 and step < self.warmup_steps:
            lr = self.base_lr * (step + 1) / self.warmup_steps
        else:
            p = min(max(progress, 0.0), 1.0)
            lr = self.base_lr * (self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * p)))
        self.last_lr, self.last_progress = lr, progress
        return lr

    def state_dict(self) -> dict:
        return dict(self.__dict__)

    def load_state_dict(self, sd: dict) -> None:
        self.__dict__.update(sd)


# --------------------------------------------------------------------------- utils


def _autocast(bf16: bool):
    import torch

    if bf16:
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def lm_loss(model, x, bf16: bool):
    import torch.nn.functional as F

    inp, tgt = x[:, :-1], x[:, 1:]
    with _autocast(bf16):
        logits = model(input_ids=inp, use_cache=False).logits
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), tgt.reshape(-1))


def evaluate(model, windows, bf16: bool, batch_size: int) -> float:
    import torch

    was_training = model.training
    model.eval()
    tot, n = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(windows), batch_size):
            xb = windows[i : i + batch_size]
            tot += lm_loss(model, xb, bf16).item() * xb.size(0)
            n += xb.size(0)
    if was_training:
        model.train()
    return tot / max(n, 1)


def _set_threads(threads: Optional[int]) -> None:
    import torch

    if threads:
        torch.set_num_threads(threads)
        with contextlib.suppress(RuntimeError):
            torch.set_num_interop_threads(1)


def _rng_state(np_rng: np.random.Generator) -> dict:
    import torch

    return {
        "torch": torch.get_rng_state(),
        "numpy_batch": np_rng.bit_generator.state,
        "python": random.getstate(),
    }


def _restore_rng(state: dict, np_rng: np.random.Generator) -> None:
    import torch

    torch.set_rng_state(state["torch"])
    np_rng.bit_generator.state = state["numpy_batch"]
    random.setstate(state["python"])


def _file_sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


# --------------------------------------------------------------------------- checkpoint


CKPT_NAME = "checkpoint"


def save_checkpoint(out_dir: Path, model, optimizer, sched: WarmupCosine, state: dict, np_rng) -> Path:
    import torch

    ckpt = out_dir / CKPT_NAME
    tmp = out_dir / (CKPT_NAME + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": sched.state_dict(),
            "rng": _rng_state(np_rng),
            "state": state,
            "config": model.config.to_dict(),
        },
        tmp / "state.pt",
    )
    (tmp / "trainer_state.json").write_text(json.dumps(state, indent=1, default=str) + "\n")
    old = out_dir / (CKPT_NAME + ".old")
    if ckpt.exists():
        if old.exists():
            shutil.rmtree(old)
        ckpt.rename(old)
    tmp.rename(ckpt)
    if old.exists():
        shutil.rmtree(old)
    return ckpt


def load_checkpoint(out_dir: Path) -> Optional[dict]:
    import torch

    f = Path(out_dir) / CKPT_NAME / "state.pt"
    if not f.is_file():
        old = Path(out_dir) / (CKPT_NAME + ".old") / "state.pt"  # crash between renames
        if not old.is_file():
            return None
        f = old
    return torch.load(f, map_location="cpu", weights_only=False)


# --------------------------------------------------------------------------- export


def export_model(model, tok, export_dir: Path, card: str) -> Path:
    import copy

    import torch

    export_dir = Path(export_dir)
    export_dir.mkdir(parents=True, exist_ok=True)
    m16 = copy.deepcopy(model).to(torch.float16)
    m16.generation_config.bos_token_id = tok.eos_token_id
    m16.generation_config.eos_token_id = tok.eos_token_id
    m16.generation_config.pad_token_id = tok.eos_token_id
    m16.save_pretrained(str(export_dir), safe_serialization=True)
    tok.save_pretrained(str(export_dir))
    (export_dir / "README.md").write_text(card)
    return export_dir


def _rope_theta(cfg: dict) -> float:
    """transformers 5 keeps rope_theta inside rope_parameters; 4.x configs kept it at the top level."""
    return (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta"))


def model_card(info: dict) -> str:
    cfg = info["config"]
    cnt = info["manifest_counts"]
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: text-generation",
        "license: apache-2.0",
        "tags: [draftverify, code, python, llama, speculative-decoding]",
        "---",
        "",
        f"# draftverify code-{info['preset']} ({info['params'] / 1e6:.2f}M parameters)",
        "",
        f"A small `LlamaForCausalLM` trained from scratch by `draftverify train lm` as the "
        f"*{info['preset']}* model of the project's code model pair (speculative decoding experiments). "
        "It is a toy model: it completes Python source in the style of the standard library and is "
        "not meant for anything else.",
        "",
        "## Data",
        "",
        f"- Corpus: the `.py` files of the CPython {info['python_version']} standard library "
        "(excluding `site-packages` / `dist-packages`), as listed in `zoo/code/manifest.json`.",
        f"- Files: {cnt.get('train', 0) + cnt.get('val', 0)} "
        f"({cnt.get('train', 0)} train / {cnt.get('val', 0)} held-out validation; split by file via a hash of the path), "
        f"{info['manifest_skipped']} non-UTF-8/empty files skipped.",
        f"- Manifest hash (sha256 of the file list): `{info['manifest_hash']}`",
        f"- Tokens: {info['train_tokens']:,} train / {info['val_tokens']:,} validation "
        f"(tokenizer sha256 `{info['tokenizer_hash'][:16]}`, byte-level BPE, vocab {cfg['vocab_size']}, "
        "`<|endoftext|>` = bos/eos/pad, documents joined with eos).",
        "",
        "## Model",
        "",
        f"- Parameters: {info['params']:,} (tied input/output embeddings)",
        f"- hidden {cfg['hidden_size']}, layers {cfg['num_hidden_layers']}, heads {cfg['num_attention_heads']} "
        f"(kv {cfg['num_key_value_heads']}), intermediate {cfg['intermediate_size']}, "
        f"max positions {cfg['max_position_embeddings']}, RoPE theta {_rope_theta(cfg)}",
        "- Weights exported in float16 (safetensors); trained in "
        + ("bf16 autocast (fp32 master weights)" if info["bf16"] else "float32") + " on CPU.",
        "",
        "## Training",
        "",
        "```",
        info["command"],
        "```",
        "",
        f"- Sequence length {info['seq_len']}, batch {info['batch_size']} sequences "
        f"({info['seq_len'] * info['batch_size']:,} tokens/step), AdamW (betas {info['betas']}, "
        f"weight decay {info['weight_decay']}), peak LR {info['lr']}, {info['warmup_steps']} warmup steps, "
        f"cosine decay to {info['min_lr_ratio']}x, grad clip {info['grad_clip']}, seed {info['seed']}.",
        f"- Steps: {info['step']:,}; tokens seen: {info['tokens_seen']:,} "
        f"({info['tokens_seen'] / max(info['train_tokens'], 1):.2f} epochs)",
        f"- Training time: {info['elapsed'] / 60:.1f} min on {info['threads']} CPU thread(s) "
        f"({info['cpu']}), {info['tokens_per_s']:.0f} tokens/s average.",
        f"- Initialised from: {info['init_from'] or 'random init'}; resumed {info['resumes']} time(s) from checkpoint.",
        f"- Final held-out loss: {info['val_loss']:.4f} nats/token (perplexity {math.exp(min(info['val_loss'], 50)):.2f}) "
        f"on {info['val_windows']} fixed windows of the validation split.",
        f"- Software: torch {info['torch']}, transformers {info['transformers']}, Python {platform.python_version()}.",
        "",
        "## Usage",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "tok = AutoTokenizer.from_pretrained(path)",
        "model = AutoModelForCausalLM.from_pretrained(path, dtype=\"auto\")  # float16 weights",
        "```",
        "",
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------- training


class _Stop:
    def __init__(self):
        self.requested = False
        self.reason = ""


def train(opts: TrainOptions, log: Callable[[str], None] = print,
          stop_after_steps: Optional[int] = None) -> dict:
    """Run (or resume) a training run.  Returns a summary dict.

    ``stop_after_steps`` interrupts this invocation after that many optimizer
    steps (checkpointing, no export) -- used to test resume.
    """
    opts.validate()
    # keep the Rust tokenizer from spawning a thread pool on the other cores
    if opts.threads == 1:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    from transformers import LlamaForCausalLM, __version__ as tf_version

    _set_threads(opts.threads)
    bf16 = DEFAULT_BF16 if opts.bf16 is None else bool(opts.bf16)
    out_dir = Path(opts.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    export_dir = Path(opts.export_dir) if opts.export_dir else out_dir / "export"
    cache_dir = Path(opts.cache_dir) if opts.cache_dir else out_dir.parent / "token-cache"
    command = opts.command or " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv])

    try:
        tok = load_tokenizer(opts.tokenizer)
    except TokenizerError as e:
        raise TrainError(str(e)) from None
    try:
        manifest = corpus_mod.load_manifest(opts.manifest)
        data = load_token_cache(manifest, opts.tokenizer, tok, str(cache_dir), log=log)
    except corpus_mod.CorpusError as e:
        raise TrainError(str(e)) from None
    train_data, val_data = data["train"], data["val"]
    if len(train_data) <= opts.seq_len + 1:
        raise TrainError(f"train split has only {len(train_data)} tokens; need > seq_len+1 ({opts.seq_len + 1})")
    val_windows = fixed_windows(val_data, opts.val_windows, opts.seq_len)

    # ---- model
    torch.manual_seed(opts.seed)
    random.seed(opts.seed)
    np_rng = np.random.default_rng(opts.seed)
    ckpt = load_checkpoint(out_dir)
    if ckpt is not None:
        from transformers import LlamaConfig

        config = LlamaConfig.from_dict(ckpt["config"])
        model = LlamaForCausalLM(config)
    elif opts.init_from:
        model = LlamaForCausalLM.from_pretrained(opts.init_from, dtype=torch.float32)
        config = model.config
        if config.vocab_size != len(tok):
            raise TrainError(f"--init-from model vocab {config.vocab_size} != tokenizer vocab {len(tok)}")
    else:
        config = make_config(opts.preset, len(tok), tok.eos_token_id, **opts.config_overrides)
        model = LlamaForCausalLM(config)
    if opts.seq_len > config.max_position_embeddings:
        raise TrainError(f"--seq-len {opts.seq_len} exceeds max_position_embeddings {config.max_position_embeddings}")
    model.config._attn_implementation = "sdpa"
    model.train()
    n_params = count_params(model)

    optimizer = make_optimizer(model, opts.lr, opts.weight_decay, opts.beta1, opts.beta2)
    sched = WarmupCosine(opts.lr, opts.warmup_steps, opts.min_lr_ratio)

    state = {
        "step": 0, "tokens_seen": 0, "elapsed": 0.0, "val_loss": None, "best_val_loss": None,
        "resumes": 0, "finished": False, "preset": opts.preset, "init_from": opts.init_from,
        "commands": [],
    }
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        sched.load_state_dict(ckpt["scheduler"])
        # an explicit new --lr/--warmup on resume wins over the saved one
        sched.base_lr, sched.warmup_steps, sched.min_ratio = opts.lr, opts.warmup_steps, opts.min_lr_ratio
        state.update(ckpt["state"])
        state["resumes"] += 1
        _restore_rng(ckpt["rng"], np_rng)
        log(f"resumed from {out_dir / CKPT_NAME} at step {state['step']} "
            f"({state['elapsed'] / 60:.1f} min, {state['tokens_seen']:,} tokens)")
        del ckpt
    state["commands"] = list(state.get("commands", [])) + [command]

    budget = opts.max_minutes * 60.0 if opts.max_minutes else None
    tokens_per_step = opts.batch_size * opts.seq_len

    def progress() -> float:
        ps = []
        if opts.max_steps:
            ps.append(state["step"] / opts.max_steps)
        if budget:
            ps.append(state["elapsed"] / budget)
        return max(ps)

    def done() -> bool:
        if opts.max_steps is not None and state["step"] >= opts.max_steps:
            return True
        if budget is not None and state["elapsed"] >= budget:
            return True
        return False

    log(f"model: {opts.preset if not opts.init_from else 'init-from ' + opts.init_from} | "
        f"{n_params:,} params | seq {opts.seq_len} x batch {opts.batch_size} | lr {opts.lr} | "
        f"{'bf16 autocast' if bf16 else 'fp32'} | threads {torch.get_num_threads()} | "
        f"train {len(train_data):,} tok / val {len(val_data):,} tok ({len(val_windows)} val windows)")
    log_path = out_dir / "log.jsonl"

    stop = _Stop()
    old_handlers = {}

    def _on_signal(signum, frame):
        stop.requested, stop.reason = True, signal.Signals(signum).name

    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(ValueError):  # not in main thread
            old_handlers[sig] = signal.signal(sig, _on_signal)

    use_bar = opts.progress if opts.progress is not None else sys.stderr.isatty()
    bar = None
    if use_bar:
        from tqdm.auto import tqdm

        bar = tqdm(total=opts.max_steps, initial=state["step"], unit="step", dynamic_ncols=True)

    steps_this_run = 0
    seg_start = time.time()
    base_elapsed = state["elapsed"]
    last_ckpt = last_eval = state["elapsed"]
    last_eval_step = state["step"]
    win_loss, win_n, win_t0, win_tok = 0.0, 0, time.time(), 0
    tok_s = 0.0
    try:
        while not done() and not stop.requested:
            lr = sched.lr(state["step"], progress())
            for g in optimizer.param_groups:
                g["lr"] = lr
            x = sample_batch(train_data, np_rng, opts.batch_size, opts.seq_len)
            loss = lm_loss(model, x, bf16)
            if not torch.isfinite(loss):
                raise TrainError(f"loss became {loss.item()} at step {state['step']}; try a lower --lr")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), opts.grad_clip)
            optimizer.step()

            state["step"] += 1
            state["tokens_seen"] += tokens_per_step
            steps_this_run += 1
            state["elapsed"] = base_elapsed + (time.time() - seg_start)
            win_loss += loss.item()
            win_n += 1
            win_tok += tokens_per_step

            val = None
            eval_due = (
                (opts.eval_every_steps and state["step"] - last_eval_step >= opts.eval_every_steps)
                or (not opts.eval_every_steps and state["elapsed"] - last_eval >= opts.eval_minutes * 60)
            )
            if eval_due:
                val = evaluate(model, val_windows, bf16, opts.batch_size)
                state["val_loss"] = val
                if state["best_val_loss"] is None or val < state["best_val_loss"]:
                    state["best_val_loss"] = val
                last_eval, last_eval_step = state["elapsed"], state["step"]

            if state["step"] % opts.log_every == 0 or val is not None:
                dt = time.time() - win_t0
                tok_s = win_tok / dt if dt > 0 else 0.0
                rec = {
                    "step": state["step"], "elapsed": round(state["elapsed"], 2),
                    "train_loss": round(win_loss / max(win_n, 1), 5),
                    "val_loss": None if val is None else round(val, 5),
                    "lr": lr, "tokens_seen": state["tokens_seen"], "tokens_per_s": round(tok_s, 1),
                    "grad_norm": round(float(gnorm), 4),
                }
                with open(log_path, "a") as fh:
                    fh.write(json.dumps(rec) + "\n")
                if bar is None:
                    log(f"step {state['step']:>6} | loss {rec['train_loss']:.4f} | "
                        f"val {'-' if state['val_loss'] is None else format(state['val_loss'], '.4f')} | "
                        f"lr {lr:.2e} | {tok_s:,.0f} tok/s | {state['tokens_seen']:,} tok | "
                        f"{state['elapsed'] / 60:.1f} min")
                win_loss, win_n, win_t0, win_tok = 0.0, 0, time.time(), 0
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss.item():.3f}",
                                val="-" if state["val_loss"] is None else f"{state['val_loss']:.3f}",
                                tok_s=f"{tok_s:,.0f}", min=f"{state['elapsed'] / 60:.1f}")

            if state["elapsed"] - last_ckpt >= opts.checkpoint_minutes * 60:
                save_checkpoint(out_dir, model, optimizer, sched, state, np_rng)
                last_ckpt = state["elapsed"]
            if stop_after_steps is not None and steps_this_run >= stop_after_steps:
                stop.requested, stop.reason = True, "stop_after_steps"
    finally:
        if bar is not None:
            bar.close()
        for sig, h in old_handlers.items():
            with contextlib.suppress(Exception):
                signal.signal(sig, h)

    if stop.requested and not done():
        save_checkpoint(out_dir, model, optimizer, sched, state, np_rng)
        log(f"stopped ({stop.reason}) at step {state['step']}; checkpoint saved to {out_dir / CKPT_NAME}; "
            "run the same command again to resume")
        return {"step": state["step"], "stopped": True, "params": n_params, "out_dir": str(out_dir)}

    # ---- final evaluation, checkpoint, export
    val = evaluate(model, val_windows, bf16, opts.batch_size)
    state["val_loss"] = val
    state["finished"] = True
    with open(log_path, "a") as fh:
        fh.write(json.dumps({"step": state["step"], "elapsed": round(state["elapsed"], 2), "train_loss": None,
                             "val_loss": round(val, 5), "lr": sched.last_lr,
                             "tokens_seen": state["tokens_seen"], "final": True}) + "\n")
    save_checkpoint(out_dir, model, optimizer, sched, state, np_rng)
    log(f"done: step {state['step']} | val loss {val:.4f} | {state['tokens_seen']:,} tokens | "
        f"{state['elapsed'] / 60:.1f} min")

    info = {
        "preset": opts.preset if not opts.init_from else f"{opts.preset} (init from {opts.init_from})",
        "params": n_params, "config": model.config.to_dict(),
        "python_version": manifest.get("python_version", "?"),
        "manifest_counts": manifest.get("counts", {}), "manifest_skipped": len(manifest.get("skipped", [])),
        "manifest_hash": corpus_mod.manifest_hash(manifest),
        "tokenizer_hash": tokenizer_hash(opts.tokenizer),
        "train_tokens": int(len(train_data)), "val_tokens": int(len(val_data)),
        "command": "\n".join(state["commands"]) if state["resumes"] else command,
        "seq_len": opts.seq_len, "batch_size": opts.batch_size, "lr": opts.lr,
        "betas": (opts.beta1, opts.beta2), "weight_decay": opts.weight_decay,
        "warmup_steps": opts.warmup_steps, "min_lr_ratio": opts.min_lr_ratio, "grad_clip": opts.grad_clip,
        "seed": opts.seed, "step": state["step"], "tokens_seen": state["tokens_seen"],
        "elapsed": state["elapsed"], "threads": torch.get_num_threads(), "cpu": _cpu_name(),
        "tokens_per_s": state["tokens_seen"] / max(state["elapsed"], 1e-9),
        "init_from": state.get("init_from"), "resumes": state["resumes"],
        "val_loss": val, "val_windows": len(val_windows), "bf16": bf16,
        "torch": torch.__version__, "transformers": tf_version,
    }
    summary = {k: v for k, v in info.items() if k != "config"}
    summary["out_dir"] = str(out_dir)
    if opts.export:
        export_model(model, tok, export_dir, model_card(info))
        (export_dir / "training_summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
        summary["export_dir"] = str(export_dir)
        log(f"exported fp16 model to {export_dir}")
    return summary


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


# --------------------------------------------------------------------------- benchmark


def bench_step_time(preset: str = "target", batch_size: int = 4, seq_len: int = 512, threads: int = 1,
                    steps: int = 5, warmup: int = 2, vocab_size: int = 8192) -> dict:
    """Mean seconds per training step (fwd+bwd+AdamW) for fp32 and bf16 autocast."""
    import torch
    from transformers import LlamaForCausalLM

    _set_threads(threads)
    res = {"preset": preset, "batch_size": batch_size, "seq_len": seq_len, "threads": threads}
    for bf16 in (False, True):
        torch.manual_seed(0)
        model = LlamaForCausalLM(make_config(preset, vocab_size, 0))
        model.config._attn_implementation = "sdpa"
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randint(0, vocab_size, (batch_size, seq_len + 1))
        times = []
        for i in range(warmup + steps):
            t0 = time.perf_counter()
            loss = lm_loss(model, x, bf16)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if i >= warmup:
                times.append(time.perf_counter() - t0)
        key = "bf16" if bf16 else "fp32"
        res[f"{key}_s_per_step"] = sum(times) / len(times)
        res[f"{key}_tokens_per_s"] = batch_size * seq_len / res[f"{key}_s_per_step"]
        res["params"] = count_params(model)
    res["faster"] = "bf16" if res["bf16_s_per_step"] < res["fp32_s_per_step"] else "fp32"
    return res

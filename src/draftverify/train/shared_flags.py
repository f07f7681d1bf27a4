"""The flags several train commands share (--seed, --lr, --max-minutes, --out, ...), each declared once: a field
of a recipe's options (or of a command's flags dataclass) takes one with shared(default), its own default (and,
where the flag means something else there, its own help), and @shared_flags turns it into a declared option
(options/declare.option), from which cli_flags.settings_command builds the command's flags. Field names are the
recipes' option names (out_dir for --out). No torch import: `draftverify --help` builds these commands."""

from __future__ import annotations

from dataclasses import Field, dataclass, field
from typing import Any

from ..devices import DEVICE_HELP
from ..options.declare import option

SHARED_KEY = "draftverify.train.shared"
# field name -> (flag, help): the flags several recipes take, declared once
SHARED: dict[str, tuple[str, str]] = {
    "target": ("--target", "Exported target model directory."),
    "manifest": ("--manifest", "Corpus manifest JSON."),
    "tokenizer": ("--tokenizer", "Tokenizer directory (default: the target's)."),
    "out_dir": ("--out", "Run directory (checkpoint-<step>/, log.jsonl)."),
    "work_dir": ("--work-dir", "Checkpoints, caches and logs (resumable)."),
    "export_dir": ("--export", "Where to export the fp16 model (default: <out>/export)."),
    "cache_dir": ("--cache-dir", "Token cache directory (default: <out>/../token-cache)."),
    "init_from": ("--init-from", "Continue from an exported model directory (fresh optimizer)."),
    "preset": ("--preset", "Architecture preset."),
    "data": ("--data", "Multi30k folder ({split}.{lang}.gz)."),
    "src_lang": ("--src-lang", "Source language of the Multi30k files."),
    "tgt_lang": ("--tgt-lang", "Target language of the Multi30k files."),
    "train_targets": ("--train-targets", "Target-side sentences replacing the train references (distillation)."),
    "val_fraction": ("--val-fraction", "Fraction of files held out for validation."),
    "num_prompts": ("--num-prompts", "Training prompts from the train split."),
    "eval_prompts": ("--eval-prompts", "Held-out prompts from the val split."),
    "min_prompt_tokens": ("--min-prompt-tokens", "Shortest prompt (tokens)."),
    "max_prompt_tokens": ("--max-prompt-tokens", "Longest prompt (tokens)."),
    "new_tokens": ("--new-tokens", "Greedy target tokens per prompt."),
    "generate_batch": ("--generate-batch", "Prompts per batched greedy generation call."),
    "data_seed": (
        "--data-seed",
        "Seed the training and held-out prompts are drawn with (default: --seed); runs with different --seed and "
        "one --data-seed train on the same prompts and score on the same held-out set.",
    ),
    "cuts": ("--cuts", "Random cut points per sequence per step."),
    "seq_len": ("--seq-len", "Tokens per training window."),
    "max_tokens": ("--max-tokens", "Padded tokens per batch (the longer side)."),
    "batch_size": ("--batch-size", "Sequences per step."),
    "max_minutes": ("--max-minutes", "Wall-clock training budget."),
    "max_steps": ("--max-steps", "Maximum optimizer steps."),
    "threads": ("--threads", "torch.set_num_threads (default: torch's)."),
    "lr": ("--lr", "Peak learning rate."),
    "warmup_steps": ("--warmup-steps", "Steps of linear learning-rate warm-up."),
    "min_lr_ratio": ("--min-lr-ratio", "Final LR as a fraction of --lr."),
    "weight_decay": ("--weight-decay", "AdamW weight decay."),
    "grad_clip": ("--grad-clip", "Gradient norm clip."),
    "seed": ("--seed", "Random seed (initialisation, data order)."),
    "bf16": ("--bf16/--no-bf16", "bf16 autocast on CPU (default: the faster one measured on the dev box)."),
    "eval_minutes": ("--eval-minutes", "Held-out evaluation interval (minutes)."),
    "eval_every_steps": ("--eval-every", "Held-out evaluation interval in steps (overrides --eval-minutes)."),
    "val_windows": ("--val-windows", "Number of fixed validation windows."),
    "checkpoint_minutes": ("--checkpoint-minutes", "Checkpoint interval (minutes)."),
    "log_every": ("--log-every", "Log a line / JSONL record every N steps."),
    "progress": ("--progress/--no-progress", "Progress bar (default: if a tty)."),
    "max_degradation": ("--max-degradation", "Largest rise of the full model's held-out loss (nats) that is kept."),
    "device": ("--device", DEVICE_HELP + " Every model and batch of the run lives there."),
    "dtype": (
        "--dtype",
        "Precision of the frozen models the recipe reads (the target): auto (float32 on cpu, bfloat16 on a CUDA GPU "
        "that supports it else float16, float16 on mps), float32, bfloat16 or float16; trained weights stay float32.",
    ),
}
BF16_OPT_IN = "bf16 autocast (default: float32, as the zoo's copy was trained)."
OWN_DATA = (
    "Your own text instead of --manifest: a folder of text files (read recursively: .txt, .py, .md, ...) or a .jsonl "
    'with a "text" field (or "prompt" / "completion"), tokenized with the target\'s tokenizer.'
)


def shared(default: Any, help: str | None = None) -> Any:
    """A field taking the SHARED flag of its name, with this recipe's default (and help, where it differs)."""
    return field(default=default, metadata={SHARED_KEY: help})


def shared_flags(cls: type) -> type:
    """cls (before @dataclass) with each shared(...) field given its SHARED flag and help."""
    for name, value in list(vars(cls).items()):
        if isinstance(value, Field) and SHARED_KEY in value.metadata:
            flag, help_text = SHARED[name]
            setattr(cls, name, option(value.default, flag, value.metadata[SHARED_KEY] or help_text))
    return cls


def recipe_options(cls: type) -> type:
    """@dataclass for a recipe's options (a RunOptions subclass, or a mixin of them) whose shared(...) fields take
    their SHARED flags."""
    return dataclass(shared_flags(cls))


def recipe_flags(cls: type) -> type:
    """@dataclass(frozen=True) for a command's flags (a command with no options dataclass of its own)."""
    return dataclass(frozen=True)(shared_flags(cls))

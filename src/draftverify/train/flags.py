"""The flags of the train commands that have no options dataclass of their own to declare them (tokenizer, corpus,
bench, ngram, align, heads, bita, eagle3, translate-tokenizer, seq2seq, distill, nat), one dataclass per command,
its fields made with options/declare.option or shared_flags.shared, so cli_flags.settings_command builds each
command's flags from it. values() passes them on to a recipe's options as they are. No torch import:
`draftverify --help` builds these commands."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

from ..options.declare import option
from .corpus import PACKAGES_ROOT
from .shared_flags import OWN_DATA, recipe_flags, shared


def values(flags: Any, *leave_out: str) -> dict[str, Any]:
    """The flags' values as the recipes' options take them (paths as text), less the named fields."""
    out = {}
    for f in fields(flags):
        if f.name not in leave_out:
            value = getattr(flags, f.name)
            out[f.name] = str(value) if isinstance(value, Path) else value
    return out


@recipe_flags
class DeviceFlags:
    """--device, for the recipes that run models (their flags' dataclasses derive from it)."""

    device: str = shared("cpu")


@recipe_flags
class FrozenDeviceFlags(DeviceFlags):
    """--device and --dtype, for the recipes that learn from a frozen target."""

    dtype: str = shared("auto")


CODE_MANIFEST = Path("zoo/code/manifest.json")
MULTI30K = Path("../shared/data/multi30k_en_de")


@recipe_flags
class TokenizerFlags:
    out: Path = option(Path("zoo/code/tokenizer"), "--out", "Tokenizer output directory.")
    manifest: Path | None = option(None, "--manifest", "Manifest JSON to write (default: <out>/../manifest.json).")
    vocab_size: int = option(8192, "--vocab-size", "BPE vocabulary size (incl. <|endoftext|>).")
    root: Path | None = option(None, "--root", "Directory of .py files (default: this interpreter's stdlib).")
    val_fraction: float = shared(0.02)


@recipe_flags
class CorpusFlags:
    out: Path = option(CODE_MANIFEST, "--out", "Manifest JSON to write.")
    src_root: Path = option(
        PACKAGES_ROOT, "--src-root", "Where the stdlib copy and the unpacked packages go (the corpus root)."
    )
    wheel_dir: Path = option(Path("runs/wheels"), "--wheel-dir", "Where pip downloads the wheels.")
    package: list[str] | None = option(
        None, "--package", "Requirement to add (repeatable); default: the project's pinned list."
    )
    download: bool = option(True, "--download/--no-download", "Fetch wheels (else use --wheel-dir as is).")
    val_fraction: float = shared(0.02)


@recipe_flags
class BenchFlags:
    preset: str = shared("target")
    batch_size: int = shared(4)
    seq_len: int = shared(512)
    threads: int = shared(1)
    steps: int = option(4, "--steps", "Timed training steps per setting.")


@recipe_flags
class TranslateTokenizerFlags:
    data: Path = shared(MULTI30K)
    out: Path = option(Path("zoo/translate/tokenizer"), "--out", "Tokenizer output directory.")
    src_lang: str = shared("en")
    tgt_lang: str = shared("de")
    vocab_size: int = option(8000, "--vocab-size", "Joint BPE vocabulary size (incl. <|endoftext|>).")


@recipe_flags
class DistillFlags:
    model: Path = option(Path("zoo/translate/target"), "--model", "Exported translation model (the teacher).")
    out: Path = option(..., "--out", "Output text file, one translation a line (resumable: appended).")
    data: Path = shared(MULTI30K)
    split: str = option("train", "--split", "train, val or test_2016_flickr.")
    src_lang: str = shared("en")
    tgt_lang: str = shared("de")
    threads: int | None = shared(None)


@recipe_flags
class NatFlags(FrozenDeviceFlags):
    out_dir: Path = shared(...)
    target: Path = shared(
        Path("zoo/translate/target"), "The frozen target: a translation model, or a decoder-only LM (zoo/code/target)."
    )
    export_dir: Path | None = shared(
        None, "Where to save the drafter (default: zoo/translate/nat, or zoo/code/nat for a decoder-only target)."
    )
    train_targets: Path | None = shared(None, "Translation: distilled train targets (`train distill`).")
    val_targets: Path | None = option(
        None, "--val-targets", "Translation: distilled val targets (default: references)."
    )
    data: Path | None = shared(None, f"Translation: Multi30k folder (default {MULTI30K}). Decoder-only: {OWN_DATA}")
    src_lang: str = shared("en")
    tgt_lang: str = shared("de")
    manifest: Path = shared(CODE_MANIFEST, "Decoder-only: the corpus manifest.")
    work_dir: Path = shared(
        Path("runs/nat-code"),
        "Decoder-only: generations and hidden states (`train heads`'s work dir reuses its generations).",
    )
    num_prompts: int = shared(700, "Decoder-only: train prompts (the target continues each).")
    eval_prompts: int = shared(80, "Decoder-only: held-out prompts (val split).")
    min_prompt_tokens: int = shared(32, "Decoder-only: shortest prompt.")
    max_prompt_tokens: int = shared(128, "Decoder-only: longest prompt.")
    new_tokens: int = shared(64, "Decoder-only: greedy tokens per prompt.")
    generate_batch: int = shared(64, "Decoder-only: prompts per generate call.")
    data_seed: int | None = shared(
        None,
        "Decoder-only: seed the train and held-out prompts are drawn with (default: --seed); runs with different "
        "--seed and one --data-seed score on the same held-out set.",
    )
    window: int = option(64, "--window", "Decoder-only: W, the target hidden states the drafter reads.")
    cuts: int = shared(16, "Decoder-only: blocks per sequence per step.")
    batch_size: int = shared(8, "Decoder-only: sequences per step.")
    block_size: int = option(8, "--block-size", "k: the most slots filled per pass (trained on 1..k).")
    layers: int = option(2, "--layers", "Decoder layers of the drafter.")
    glancing: bool = option(True, "--glancing/--no-glancing", "GLAT glancing (ratio 0.5 -> 0.3).")
    max_minutes: float | None = shared(None)
    max_steps: int | None = shared(None)
    threads: int | None = shared(None)
    max_tokens: int = shared(2048, "Translation: padded tokens per batch.")
    lr: float = shared(1e-3)
    warmup_steps: int | None = shared(None, "Default: 200 (translation), 50 (decoder-only).")
    seed: int = shared(1234)
    bf16: bool | None = shared(None)
    eval_minutes: float = shared(5.0)
    eval_every_steps: int | None = shared(None)
    checkpoint_minutes: float = shared(5.0)
    log_every: int = shared(20)
    progress: bool | None = shared(None)

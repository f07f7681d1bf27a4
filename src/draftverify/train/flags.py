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
CODE_TARGET = Path("zoo/code/target")
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
class NgramFlags:
    out: Path = option(Path("zoo/code/ngram.safetensors"), "--out", "Output table (safetensors).")
    tokenizer: Path = shared(Path("zoo/code/tokenizer"), "Tokenizer directory.")
    manifest: Path = shared(CODE_MANIFEST)
    data: Path | None = shared(None, OWN_DATA)
    from_generations: Path | None = option(
        None,
        "--from-generations",
        "Build from a JSONL of target generations "
        "(written by `train align`) instead of the corpus; only continuation "
        "tokens are counted as next tokens.",
    )
    eval_generations: Path | None = option(
        None,
        "--eval-generations",
        "Also report top-1 accuracy on the "
        "continuations of this generations JSONL (e.g. runs/align/"
        "eval_before.jsonl: held-out target outputs).",
    )
    order: int = option(3, "--order", "n: contexts of up to n-1 tokens.")
    min_count: int = option(2, "--min-count", "Drop contexts seen fewer times (the unigram is kept).")
    top_k: int = option(8, "--top-k", "Keep at most this many next tokens per context.")
    cache_dir: Path | None = shared(
        None, "Reuse/write `train lm`'s token cache here (e.g. runs/token-cache); default: tokenize in memory."
    )
    max_tokens: int | None = shared(None, "Use only the first N training tokens.")
    vocab_size: int | None = option(
        None, "--vocab-size", "Table vocabulary (default: the tokenizer's, or the generations file's)."
    )
    evaluate: bool = option(True, "--eval/--no-eval", "Held-out top-1 accuracy on the val split.")


@recipe_flags
class AlignFlags(FrozenDeviceFlags):
    target: Path = shared(CODE_TARGET)
    draft: Path = option(Path("zoo/code/draft"), "--draft", "Exported draft model directory to align.")
    manifest: Path = shared(CODE_MANIFEST)
    data: Path | None = shared(None, OWN_DATA)
    tokenizer: Path | None = shared(None)
    out_dir: Path = shared(Path("zoo/code/draft-aligned"), "Where to export the aligned draft.")
    work_dir: Path = shared(Path("runs/align"))
    generations: Path | None = option(
        None, "--generations", "Calibration generations JSONL (default: <work-dir>/generations.jsonl)."
    )
    num_prompts: int = shared(1000)
    eval_prompts: int = shared(64, "Held-out prompts from the val split for alpha before/after (0 = skip).")
    min_prompt_tokens: int = shared(64)
    max_prompt_tokens: int = shared(256)
    new_tokens: int = shared(128)
    gamma: int = option(5, "--gamma", "Draft length for generation and the alpha measurement.")
    max_minutes: float | None = shared(None)
    max_steps: int | None = shared(None)
    lr: float = shared(5e-4)
    batch_size: int = shared(16, "Sequences (prompt + continuation) per step.")
    warmup_steps: int = shared(20)
    min_lr_ratio: float = shared(0.1)
    weight_decay: float = shared(0.0)
    grad_clip: float = shared(1.0)
    threads: int | None = shared(None)
    bf16: bool | None = shared(None)
    eval_every_steps: int | None = shared(None)
    checkpoint_minutes: float = shared(10.0)
    log_every: int = shared(10)
    seed: int = shared(1234)
    progress: bool | None = shared(None)


@recipe_flags
class HeadsFlags(FrozenDeviceFlags):
    target: Path = shared(CODE_TARGET)
    manifest: Path = shared(CODE_MANIFEST)
    data: Path | None = shared(None, OWN_DATA)
    tokenizer: Path | None = shared(None)
    out_dir: Path = shared(Path("zoo/code/heads"), "Where to save the heads (safetensors + JSON).")
    work_dir: Path = shared(Path("runs/heads"))
    num_heads: int = option(4, "--num-heads", "h, counting head 1 (the target itself); 2..9.")
    ffn_size: int | None = option(None, "--ffn-size", "Hidden layer of each head (default: hidden size).")
    num_prompts: int = shared(400)
    eval_prompts: int = shared(48)
    min_prompt_tokens: int = shared(32)
    max_prompt_tokens: int = shared(128)
    new_tokens: int = shared(64)
    generate_batch: int = shared(32)
    max_minutes: float | None = shared(None)
    max_steps: int | None = shared(None)
    lr: float = shared(2e-3)
    batch_size: int = shared(512, "Positions per step.")
    warmup_steps: int = shared(20)
    threads: int | None = shared(None)
    checkpoint_minutes: float = shared(2.0)
    log_every: int = shared(50)
    seed: int = shared(1234)
    progress: bool | None = shared(None)


@recipe_flags
class Eagle3Flags(FrozenDeviceFlags):
    target: Path = shared(CODE_TARGET)
    manifest: Path = shared(CODE_MANIFEST)
    data: Path | None = shared(None, OWN_DATA)
    tokenizer: Path | None = shared(None)
    out_dir: Path = shared(Path("zoo/code/eagle3"), "Where to save the head (EAGLE-3 checkpoint layout + card).")
    work_dir: Path = shared(Path("runs/eagle3"))
    ttt_steps: int = option(6, "--ttt-steps", "Training-time-test steps k (the head fed its own outputs); 1..16.")
    intermediate_size: int | None = option(None, "--intermediate-size", "The head's MLP size (default: the target's).")
    num_prompts: int = shared(400)
    eval_prompts: int = shared(48)
    min_prompt_tokens: int = shared(32)
    max_prompt_tokens: int = shared(128)
    new_tokens: int = shared(64)
    generate_batch: int = shared(32)
    max_minutes: float | None = shared(None)
    max_steps: int | None = shared(None)
    lr: float = shared(1e-3)
    batch_size: int = shared(8)
    warmup_steps: int = shared(20)
    threads: int | None = shared(None)
    bf16: bool | None = shared(False, "bf16 autocast (default: float32, as the zoo's head was trained).")
    checkpoint_minutes: float = shared(5.0)
    log_every: int = shared(10)
    seed: int = shared(1234)
    progress: bool | None = shared(None)


@recipe_flags
class BitaFlags(FrozenDeviceFlags):
    target: Path = shared(CODE_TARGET)
    manifest: Path = shared(
        CODE_MANIFEST, "Corpus manifest JSON (without the unpacked corpus: its stdlib files, read locally)."
    )
    data: Path | None = shared(None, OWN_DATA)
    tokenizer: Path | None = shared(None)
    out_dir: Path = shared(Path("zoo/code/bita"), "Where to save the adapter (safetensors + JSON + card).")
    work_dir: Path = shared(Path("runs/bita"))
    prompt: str = option("deep", "--prompt", "Prompt tokens: none (mask tokens only), shallow or deep.")
    num_masks: int = option(3, "--num-masks", "M mask tokens (look-ahead positions).")
    num_prompts: int = shared(16, "P prompt tokens (shallow / deep).")
    num_train: int = option(512, "--num-train", "Training prompts from the train split.")
    eval_prompts: int = shared(32)
    min_prompt_tokens: int = shared(32)
    max_prompt_tokens: int = shared(128)
    new_tokens: int = shared(96)
    gen_batch: int = option(32, "--gen-batch", "Prompts generated together (batched greedy).")
    cuts: int = shared(16)
    max_minutes: float | None = shared(None)
    max_steps: int | None = shared(None)
    lr: float = shared(3e-2)
    batch_size: int = shared(8)
    warmup_steps: int = shared(20)
    threads: int | None = shared(None)
    checkpoint_minutes: float = shared(2.0)
    log_every: int = shared(20)
    seed: int = shared(1234)
    progress: bool | None = shared(None)


@recipe_flags
class TranslateTokenizerFlags:
    data: Path = shared(MULTI30K)
    out: Path = option(Path("zoo/translate/tokenizer"), "--out", "Tokenizer output directory.")
    src_lang: str = shared("en")
    tgt_lang: str = shared("de")
    vocab_size: int = option(8000, "--vocab-size", "Joint BPE vocabulary size (incl. <|endoftext|>).")


@recipe_flags
class Seq2SeqFlags:
    out_dir: Path = shared(...)
    tokenizer: Path = shared(Path("zoo/translate/tokenizer"), "Joint tokenizer directory.")
    data: Path = shared(MULTI30K)
    src_lang: str = shared("en")
    tgt_lang: str = shared("de")
    preset: str = shared("target", "Architecture: target | small (| tiny).")
    export_dir: Path | None = shared(None)
    train_targets: Path | None = shared(None)
    init_from: Path | None = shared(None, "Continue from an exported model (fresh optimizer), e.g. BiLD alignment.")
    max_minutes: float | None = shared(None)
    max_steps: int | None = shared(None)
    threads: int | None = shared(None)
    max_tokens: int = shared(2048)
    lr: float = shared(1e-3)
    warmup_steps: int = shared(400)
    min_lr_ratio: float = shared(0.05)
    weight_decay: float = shared(0.01)
    label_smoothing: float = option(0.1, "--label-smoothing", "Label smoothing of the cross-entropy loss.")
    dropout: float = option(0.1, "--dropout", "Dropout of the model.")
    grad_clip: float = shared(1.0)
    seed: int = shared(1234)
    bf16: bool | None = shared(None)
    eval_minutes: float = shared(10.0, "Val loss / BLEU / chrF interval (minutes).")
    eval_every_steps: int | None = shared(None)
    bleu_sentences: int = option(200, "--bleu-sentences", "Val sources translated at each evaluation.")
    checkpoint_minutes: float = shared(5.0)
    log_every: int = shared(20)
    progress: bool | None = shared(None)


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

"""Byte-level BPE tokenizer for Python source, trained with HF ``tokenizers``.

The result is saved with ``PreTrainedTokenizerFast.save_pretrained`` so that
``transformers.AutoTokenizer.from_pretrained(dir)`` loads it.  A single special
token ``<|endoftext|>`` serves as bos / eos / pad (and unk).  Byte-level BPE is
lossless, and ``clean_up_tokenization_spaces`` is disabled, so
``decode(encode(text)) == text`` for any source file (indentation, tabs, blank
lines, trailing whitespace, non-ASCII included).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Iterable

EOS_TOKEN = "<|endoftext|>"
DEFAULT_VOCAB_SIZE = 8192


class TokenizerError(RuntimeError):
    pass


def train_tokenizer(
    texts: Iterable[str],
    out_dir: str | os.PathLike,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    min_frequency: int = 2,
    model_max_length: int = 2048,
    show_progress: bool = False,
):
    """Train a byte-level BPE on ``texts`` and save it to ``out_dir``.

    Returns the ``PreTrainedTokenizerFast``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 256 + 1:
        raise TokenizerError(f"vocab_size must be > 256 for byte-level BPE, got {vocab_size}")
    if vocab_size > 65535:
        raise TokenizerError("vocab_size must fit in uint16 (<= 65535)")

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    tok.train_from_iterator(texts, trainer=trainer)

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        unk_token=EOS_TOKEN,
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length,
        add_prefix_space=False,
    )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))
    return fast


def load_tokenizer(tok_dir: str | os.PathLike):
    """Load a tokenizer directory written by :func:`train_tokenizer` (clear errors)."""
    from transformers import AutoTokenizer

    p = Path(tok_dir)
    if not p.is_dir():
        raise TokenizerError(
            f"tokenizer directory {p} not found (create it with `draftverify train tokenizer --out {p}`)"
        )
    if not (p / "tokenizer.json").is_file():
        raise TokenizerError(f"{p} has no tokenizer.json; is it a tokenizer directory?")
    tok = AutoTokenizer.from_pretrained(str(p))
    if tok.eos_token_id is None:
        raise TokenizerError(f"tokenizer in {p} has no eos token")
    return tok


def tokenizer_hash(tok_dir: str | os.PathLike) -> str:
    """sha256 of tokenizer.json (identifies the token ids of a cached corpus)."""
    return hashlib.sha256((Path(tok_dir) / "tokenizer.json").read_bytes()).hexdigest()


def build_tokenizer_from_corpus(
    out_dir: str | os.PathLike,
    manifest_path: str | os.PathLike,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    root: str | os.PathLike | None = None,
    val_fraction: float | None = None,
    show_progress: bool = False,
) -> dict:
    """Build the corpus manifest, then train the tokenizer on its *train* split.

    Returns a small summary dict (also written to ``out_dir/training_info.json``).
    """
    from . import corpus

    kw = {} if val_fraction is None else {"val_fraction": val_fraction}
    manifest = corpus.build_manifest(manifest_path, root=root, **kw)
    tok = train_tokenizer(
        corpus.iter_texts(manifest, "train"),
        out_dir,
        vocab_size=vocab_size,
        show_progress=show_progress,
    )
    # measure compression on the validation split
    n_chars = n_tokens = 0
    for text in corpus.iter_texts(manifest, "val"):
        n_chars += len(text)
        n_tokens += len(tok.backend_tokenizer.encode(text, add_special_tokens=False).ids)
    info = {
        "vocab_size": len(tok),
        "requested_vocab_size": vocab_size,
        "eos_token": EOS_TOKEN,
        "eos_token_id": tok.eos_token_id,
        "manifest": str(manifest_path),
        "manifest_files_sha256": manifest["files_sha256"],
        "counts": manifest["counts"],
        "val_chars": n_chars,
        "val_tokens": n_tokens,
        "val_chars_per_token": (n_chars / n_tokens) if n_tokens else None,
        "tokenizer_sha256": tokenizer_hash(out_dir),
    }
    (Path(out_dir) / "training_info.json").write_text(json.dumps(info, indent=1) + "\n")
    return info

"""The corpus as token arrays: each split tokenized once into a flat ``uint16`` array (documents joined with the
eos token), cached on disk under ``cache_dir/<manifest-hash>-<tokenizer-hash>/``, and the windows cut from it.

Shared by `train lm`, `train early-exit`, `train ngram` and the zoo's held-out figures, so every held-out loss the
project reports is measured on the same windows.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import corpus as corpus_mod
from .settings import TrainError
from .tokenizer import TokenizerError, load_tokenizer, tokenizer_hash


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
        meta.write_text(
            json.dumps(
                {
                    "manifest_files_sha256": corpus_mod.manifest_hash(manifest),
                    "tokenizer_sha256": tokenizer_hash(tok_dir),
                    "tokens": {k: int(len(v)) for k, v in out.items()},
                },
                indent=1,
            )
            + "\n"
        )
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


@dataclass
class Corpus:
    """The tokenizer, the manifest, both splits as token arrays and the fixed held-out windows of a run."""

    tok: Any
    manifest: dict
    train: np.ndarray
    val: np.ndarray
    val_windows: Any  # LongTensor [n, seq_len + 1]


def check_corpus_inputs(tokenizer_dir: str, manifest: str) -> None:
    """Raise TrainError naming the missing input (before any slow work starts)."""
    if not Path(manifest).exists():
        raise TrainError(f"manifest {manifest} not found (run `draftverify train tokenizer` first)")
    if not (Path(tokenizer_dir) / "tokenizer.json").is_file():
        raise TrainError(
            f"tokenizer directory {tokenizer_dir} not found or has no tokenizer.json "
            "(run `draftverify train tokenizer` first)"
        )


@contextlib.contextmanager
def as_train_errors() -> Iterator[None]:
    """A tokenizer's or the corpus's error inside (a missing file, a bad manifest) raised as the TrainError a
    recipe's command reports in one line."""
    try:
        yield
    except (TokenizerError, corpus_mod.CorpusError) as e:
        raise TrainError(str(e)) from None


def load_corpus(tokenizer_dir: str, manifest: str, cache_dir: str, seq_len: int, val_windows: int, log=print) -> Corpus:
    """Tokenizer, cached token arrays and `val_windows` fixed validation windows of seq_len + 1 tokens."""
    with as_train_errors():
        tok = load_tokenizer(tokenizer_dir)
        m = corpus_mod.load_manifest(manifest)
        data = load_token_cache(m, tokenizer_dir, tok, cache_dir, log=log)
    if len(data["train"]) <= seq_len + 1:
        raise TrainError(f"train split has only {len(data['train'])} tokens; need > seq_len+1 ({seq_len + 1})")
    return Corpus(tok, m, data["train"], data["val"], fixed_windows(data["val"], val_windows, seq_len))

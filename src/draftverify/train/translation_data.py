"""Parallel text for the translation recipes (`train translate-tokenizer`, `train seq2seq`, `train nat`).

Multi30k's layout (Elliott et al. 2016): ``{split}.{lang}.gz``, one sentence a line, line i of the source file
aligned with line i of the target file. The joint tokenizer is the code zoo's byte-level BPE
(train/tokenizer.py) trained on both sides of the train split, so one embedding matrix serves encoder and decoder.
Training batches are *by tokens*: pairs sorted by length are cut into batches of at most ``max_tokens`` padded
tokens (fixed once per run), and each step draws one of them from the run's batch generator.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .settings import TrainError

DEFAULT_DATA = "../shared/data/multi30k_en_de"
TEST_SPLIT = "test_2016_flickr"
DATA_TERMS = (
    'Multi30k (Elliott et al. 2016, "Multi30K: Multilingual English-German Image Descriptions"), a '
    "research dataset; its English side comes from Flickr30k captions, used under their research terms."
)


def split_path(data_dir: str | os.PathLike, split: str, lang: str) -> Path:
    return Path(data_dir) / f"{split}.{lang}.gz"


def read_lines(data_dir: str | os.PathLike, split: str, lang: str) -> list[str]:
    """The sentences of one side of a split (stripped; a clear error when the file is missing)."""
    path = split_path(data_dir, split, lang)
    if not path.is_file():
        raise TrainError(
            f"{path} not found: --data must be a folder with {split}.{lang}.gz (Multi30k layout, e.g. {DEFAULT_DATA})"
        )
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [line.strip() for line in fh]


def read_pairs(data_dir, split: str, src_lang: str, tgt_lang: str) -> tuple[list[str], list[str]]:
    src, tgt = read_lines(data_dir, split, src_lang), read_lines(data_dir, split, tgt_lang)
    if len(src) != len(tgt):
        raise TrainError(f"{split}: {len(src)} {src_lang} lines but {len(tgt)} {tgt_lang} lines; the sides must align")
    return src, tgt


def read_targets(path: str | os.PathLike, limit: int) -> list[str]:
    """The first `limit` lines of a target-side file (`train distill` writes one sentence a line)."""
    text = Path(path).read_text(encoding="utf-8")
    lines = text[:-1].split("\n") if text.endswith("\n") else text.split("\n")
    return lines[:limit] if text else []


def with_targets(src: list[str], path: str, log: Callable[[str], None]) -> tuple[list[str], list[str]]:
    """The train sources paired with the distilled targets in `path` (`train distill`, one a line); a file that
    holds fewer targets than there are sources trains on the pairs it covers, which the log says."""
    tgt = read_targets(path, len(src))
    if len(tgt) < len(src):
        log(f"{path} has {len(tgt)} of the {len(src)} train targets: training on those pairs")
        src = src[: len(tgt)]
    return src, tgt


def train_joint_tokenizer(
    data_dir, out_dir, src_lang: str = "en", tgt_lang: str = "de", vocab_size: int = 8000
) -> dict:
    """Byte-level BPE on both sides of the train split; writes out_dir/training_info.json and returns it."""
    from .tokenizer import tokenizer_hash, train_tokenizer

    src, tgt = read_pairs(data_dir, "train", src_lang, tgt_lang)
    tok = append_eos(train_tokenizer(src + tgt, out_dir, vocab_size=vocab_size, model_max_length=512), out_dir)
    vs, vt = read_pairs(data_dir, "val", src_lang, tgt_lang)
    n_words = sum(len(s.split()) for s in vs + vt)
    n_tokens = sum(len(ids) for ids in tok(vs + vt, add_special_tokens=False)["input_ids"])
    info = {
        "vocab_size": len(tok),
        "requested_vocab_size": vocab_size,
        "eos_token_id": tok.eos_token_id,
        "data": str(data_dir),
        "languages": [src_lang, tgt_lang],
        "train_pairs": len(src),
        "val_tokens_per_word": n_tokens / max(n_words, 1),
        "tokenizer_sha256": tokenizer_hash(out_dir),
    }
    (Path(out_dir) / "training_info.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


def append_eos(tok, out_dir):
    """Make `tok(text)` end every sentence with eos, as the models saw their sources in training (and as Marian
    tokenizers do), so draftverify, HF pipelines and users feed the encoder what it was trained on."""
    from tokenizers import processors

    eos = tok.eos_token
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {eos}", pair=f"$A {eos} $B {eos}", special_tokens=[(eos, tok.eos_token_id)]
    )
    tok.save_pretrained(str(out_dir))
    return tok


def encode(tok, texts: list[str], max_len: int) -> list[np.ndarray]:
    """Token ids of each text followed by eos, cut to max_len (eos kept last)."""
    eos = tok.eos_token_id
    out = []
    for ids in tok(texts, add_special_tokens=False)["input_ids"]:
        out.append(np.asarray(ids[: max_len - 1] + [eos], dtype=np.int64))
    return out


@dataclass
class Pairs:
    """Encoded sentence pairs: sources and targets as eos-terminated id arrays."""

    src: list[np.ndarray]
    tgt: list[np.ndarray]

    def __len__(self) -> int:
        return len(self.src)


def token_batches(pairs: Pairs, max_tokens: int) -> list[np.ndarray]:
    """Indices of pairs grouped by length so that batch size x longest side <= max_tokens (at least one pair)."""
    lengths = np.array([max(len(s), len(t)) for s, t in zip(pairs.src, pairs.tgt)])
    order = np.argsort(lengths, kind="stable")
    batches, cur, longest = [], [], 0
    for i in order:
        longest_if = max(longest, int(lengths[i]))
        if cur and longest_if * (len(cur) + 1) > max_tokens:
            batches.append(np.asarray(cur))
            cur, longest_if = [], int(lengths[i])
        cur.append(int(i))
        longest = longest_if
    if cur:
        batches.append(np.asarray(cur))
    return batches


def collate(pairs: Pairs, idx, pad_id: int):
    """A padded batch: input_ids [B, S], attention_mask [B, S], labels [B, T] (-100 where padded)."""
    import torch

    src = [pairs.src[i] for i in idx]
    tgt = [pairs.tgt[i] for i in idx]
    S, T = max(map(len, src)), max(map(len, tgt))
    input_ids = torch.full((len(idx), S), pad_id, dtype=torch.long)
    mask = torch.zeros((len(idx), S), dtype=torch.long)
    labels = torch.full((len(idx), T), -100, dtype=torch.long)
    for b, (s, t) in enumerate(zip(src, tgt)):
        input_ids[b, : len(s)] = torch.from_numpy(s)
        mask[b, : len(s)] = 1
        labels[b, : len(t)] = torch.from_numpy(t)
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}

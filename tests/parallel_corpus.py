"""A tiny synthetic English-German corpus in Multi30k's layout ({split}.{lang}.gz), for the translation tests."""

from __future__ import annotations

import gzip
from pathlib import Path

import torch

WORDS_EN = ["a", "man", "woman", "dog", "rides", "walks", "bike", "street", "red", "the", "on", "with"]
WORDS_DE = ["ein", "mann", "frau", "hund", "fährt", "geht", "fahrrad", "straße", "rot", "die", "auf", "mit"]
SPLITS = (("train", 80, 0), ("val", 6, 1), ("test_2016_flickr", 6, 2))


def write_split(folder: Path, split: str, n: int, seed: int) -> None:
    """n word-by-word "translations" of random English word strings."""
    gen = torch.Generator().manual_seed(seed)
    en, de = [], []
    for _ in range(n):
        idx = torch.randint(len(WORDS_EN), (int(torch.randint(3, 8, (1,), generator=gen)),), generator=gen).tolist()
        en.append(" ".join(WORDS_EN[i] for i in idx) + ".")
        de.append(" ".join(WORDS_DE[i] for i in idx) + ".")
    for lang, lines in (("en", en), ("de", de)):
        with gzip.open(folder / f"{split}.{lang}.gz", "wt", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")


def write_parallel_corpus(root: Path) -> Path:
    """root/multi30k_en_de with train (80 pairs), val and test_2016_flickr (6 each); returns that folder."""
    data = root / "multi30k_en_de"
    data.mkdir(parents=True)
    for split, n, seed in SPLITS:
        write_split(data, split, n, seed)
    return data

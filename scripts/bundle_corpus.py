"""Pack a corpus manifest's files into two xz text files (train, val; documents separated by NUL) for a GPU run.

A lent GPU machine sees only the repository (64 MiB); the unpacked corpus is ~300 MB, its xz bundle a fraction.
Usage: python scripts/bundle_corpus.py runs/manifest-v2.json .gpu/corpus
"""
import lzma
import sys
from pathlib import Path

from draftverify.train.corpus import iter_texts

manifest, out = sys.argv[1], Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
for split in ("train", "val"):
    with lzma.open(out / f"{split}.txt.xz", "wt", encoding="utf-8", preset=6) as f:
        for i, text in enumerate(iter_texts(manifest, split)):
            f.write(("\0" if i else "") + text)
    print(split, (out / f"{split}.txt.xz").stat().st_size / 1e6, "MB")

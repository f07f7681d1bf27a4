"""A tiny, repetitive corpus of .py files for the `draftverify train` tests.

Imported as `from tiny_corpus import ...`: pytest puts this folder on sys.path for the test files in it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

SNIPPETS = [
    'def add(a, b):\n    """Return a + b."""\n    return a + b\n',
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n"
    "    def __repr__(self):\n        return f'Point({self.x}, {self.y})'\n",
    "import os\nimport sys\n\n\ndef main(argv=None):\n    if argv is None:\n        argv = sys.argv[1:]\n"
    "    for name in argv:\n        print(os.path.basename(name))\n    return 0\n",
    "for i in range(10):\n    if i % 2 == 0:\n        continue\n    else:\n        print(i)\n",
]

# Shorter variants of SNIPPETS (no __repr__, no argv default), used by the n-gram tests.
SHORT_SNIPPETS = [
    'def add(a, b):\n    """Return a + b."""\n    return a + b\n',
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "import os\nimport sys\n\n\ndef main(argv=None):\n    for name in argv:\n        print(os.path.basename(name))\n",
    "for i in range(10):\n    if i % 2 == 0:\n        continue\n    else:\n        print(i)\n",
]


def write_tiny_corpus(
    root: Path,
    n_files: int = 24,
    repeat: int = 3,
    *,
    snippets: Sequence[str] = SNIPPETS,
    per_file: int | None = None,
    stride: int = 1,
    assignments: bool = False,
    nested: bool = True,
) -> Path:
    """Write `n_files` files `mod_NN.py` under `root` and return `root`.

    File i is a `# module i` header, then `per_file` snippets (default: all of them) taken cyclically from
    `snippets` starting at index `i * stride`, each followed by a blank line, or with `assignments` by a line
    `x{i % 5} = {k}` so the files differ a little; the snippet block is repeated `repeat` times. With `nested`
    the files go in subfolders pkg0..pkg2 (by i % 3), otherwise directly in `root`.
    """
    root.mkdir(parents=True, exist_ok=True)
    count = len(snippets) if per_file is None else per_file
    for i in range(n_files):
        sub = root / ("pkg%d" % (i % 3)) if nested else root
        sub.mkdir(exist_ok=True)
        text = (
            "".join(
                snippets[(i * stride + k) % len(snippets)] + (f"\nx{i % 5} = {k}\n" if assignments else "\n")
                for k in range(count)
            )
            * repeat
        )
        (sub / f"mod_{i:02d}.py").write_text(f"# module {i}\n" + text, encoding="utf-8")
    return root


def train_tiny_target(
    folder: Path, layers: int = 2, max_positions: int = 256, repeat: int = 3, val_windows: int = 4
) -> Path:
    """A tiny corpus, its tokenizer (folder/tok, folder/manifest.json) and a tiny Llama trained on it for a few
    seconds and exported by `train lm` (folder/target, fp16 + tokenizer): the frozen target the recipes that
    train on a target's outputs (align, heads, early exit) are tested against. Returns folder."""
    from draftverify.train import lm
    from draftverify.train.tokenizer import build_tokenizer_from_corpus

    root = write_tiny_corpus(folder / "lib", n_files=24, repeat=repeat)
    build_tokenizer_from_corpus(folder / "tok", folder / "manifest.json", vocab_size=300, root=root, val_fraction=0.3)
    lm.train(
        lm.TrainOptions(
            tokenizer=str(folder / "tok"),
            manifest=str(folder / "manifest.json"),
            out_dir=str(folder / "target-run"),
            export_dir=str(folder / "target"),
            cache_dir=str(folder / "cache"),
            preset="tiny",
            seq_len=32,
            batch_size=8,
            lr=1e-2,
            warmup_steps=5,
            max_steps=100,
            threads=1,
            bf16=False,
            val_windows=val_windows,
            log_every=1000,
            eval_every_steps=10**6,
            checkpoint_minutes=1000,
            progress=False,
            config_overrides=tiny_llama(layers, max_positions),
        ),
        log=lambda _: None,
    )
    return folder


def tiny_llama(layers: int = 2, max_positions: int = 256) -> dict:
    return dict(
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=max_positions,
    )

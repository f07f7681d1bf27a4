"""Held-out loss of zoo models on the validation splits of the first (stdlib) and second (stdlib + packages) corpora.

The two zoo generations were trained on different corpora, so each is measured on both validation splits with the
same definition (`draftverify train lm`: 64 evenly spaced 512-token windows), which makes the loss figures
comparable. Writes zoo/code/held_out.json and a markdown table (--markdown, default benchmarks/zoo-held-out.md);
--from-json re-renders the table from an earlier JSON without measuring again. The first zoo (its stdlib corpus
manifest and its models) is in git history: `git worktree add ../oldzoo 60e4a64` gives ../oldzoo/zoo/code/manifest.json
and ../oldzoo/zoo/code/{target,draft}.
Usage: python scripts/zoo_held_out.py --model target=zoo/code/target --model old-target=/path/to/old/target \
           --val stdlib=old_manifest.json --val stdlib+packages=zoo/code/manifest.json --out zoo/code/held_out.json
"""
import argparse
import json
import os
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from draftverify.train.corpus import load_manifest
from draftverify.train.losses import evaluate
from draftverify.train.tokens import fixed_windows, tokenize_split

ap = argparse.ArgumentParser()
ap.add_argument("--model", action="append", default=[], help="name=path")
ap.add_argument("--val", action="append", default=[], help="name=manifest.json")
ap.add_argument("--markdown", type=Path, default=Path("benchmarks/zoo-held-out.md"))
ap.add_argument("--from-json", type=Path, default=None)
ap.add_argument("--tokenizer", default="zoo/code/tokenizer")
ap.add_argument("--out", type=Path, default=Path("zoo/code/held_out.json"))
args = ap.parse_args()


def markdown(result: dict) -> str:
    sets = list(result["validation_sets"])
    lines = ["# Held-out loss of the zoo models", "", result["definition"] + "; written by `scripts/zoo_held_out.py`.", "",
             "| model | " + " | ".join(f"val: {s}" for s in sets) + " |", "|---|" + "---|" * len(sets)]
    lines += [f"| `{m}` | " + " | ".join(f"{v[s]:.3f}" for s in sets) + " |" for m, v in result["models"].items()]
    return "\n".join(lines) + "\n"


if args.from_json is not None:
    args.markdown.write_text(markdown(json.loads(args.from_json.read_text())))
    raise SystemExit(0)
torch.set_num_threads(2)
tok = AutoTokenizer.from_pretrained(args.tokenizer)
windows = {}
for spec in args.val:
    name, path = spec.split("=", 1)
    manifest = load_manifest(path)
    windows[name] = fixed_windows(tokenize_split(manifest, tok, "val", tok.eos_token_id), 64, 512)
result = {"definition": "mean next-token cross-entropy (nats) over 64 evenly spaced 512-token windows of the "
          "validation split, fp32 on CPU", "validation_sets": {s.split("=")[0]: os.path.relpath(s.split("=")[1]) for s in args.val},
          "models": {}}
for spec in args.model:
    name, path = spec.split("=", 1)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    result["models"][name] = {v: evaluate(model, w, bf16=False, batch_size=8) for v, w in windows.items()}
    print(name, {k: round(x, 4) for k, x in result["models"][name].items()}, flush=True)
args.out.write_text(json.dumps(result, indent=1) + "\n")
args.markdown.write_text(markdown(result))

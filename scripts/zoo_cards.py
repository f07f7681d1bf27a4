"""The zoo's model cards and figures, written from the reports training saved: nothing on a card is typed by hand.

    python scripts/zoo_cards.py code [zoo/code]
    python scripts/zoo_cards.py translate [--rescore] [--data ../shared/data/multi30k_en_de]
    python scripts/zoo_cards.py held-out --model target=zoo/code/target --model old-target=/path/to/old/target \
        --val stdlib=old_manifest.json --val stdlib+packages=zoo/code/manifest.json --out zoo/code/held_out.json

code: zoo/code/{target,draft,draft-aligned}/README.md from training_report.json / alignment_report.json (written
by `scripts/gpu_zoo.py train` and `align`) and zoo/code/manifest.json and held_out.json (written by held-out).

translate: zoo/translate's target/, draft/ and draft-aligned/ cards from training_report.json
(train/seq2seq_card.py); --rescore first replaces the report's scores with greedy val / test_2016_flickr (and
--beam B test_2016_flickr), measured here. draft-aligned/'s card also gets BiLD's before / after from
--alignment-bench (`draftverify reproduce specdec`'s JSON), when it exists. nat/: README.md from nat.json.

held-out: the held-out loss of zoo models on the validation splits of the first (stdlib) and second (stdlib +
packages) corpora. The two zoo generations were trained on different corpora, so each is measured on both
validation splits with the same definition (`draftverify train lm`: 64 evenly spaced 512-token windows), which
makes the loss figures comparable. Writes zoo/code/held_out.json and a markdown table (--markdown);
--from-json re-renders the table from an earlier JSON without measuring again. The first zoo (its stdlib corpus
manifest and its models) is in git history: `git worktree add ../oldzoo 60e4a64` gives
../oldzoo/zoo/code/manifest.json and ../oldzoo/zoo/code/{target,draft}.

A BiTA adapter's card is written by `draftverify train bita` itself (draftverify.train.bita.write_card).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from draftverify.train.seq2seq_card import model_card, nat_card


def terms(manifest: dict) -> str:
    return (
        "Multi-source code corpus: the `.py` files of the CPython standard library (PSF-2.0) and of "
        f"{len(manifest['sources']) - 1} permissively licensed packages from PyPI, each file's licence recorded in "
        "`zoo/code/manifest.json` (built by `draftverify train corpus`); packages whose metadata names a copyleft "
        "licence are skipped. Identical files are kept once; the validation split is held out by file."
    )


def data_section(manifest: dict) -> str:
    files_per_licence = Counter(f.get("license", "?") for f in manifest["files"])
    total = manifest["bytes"]["train"] + manifest["bytes"]["val"]
    rows = "\n".join(f"| `{s['name']}` | {s['version']} | {s['license']} |" for s in manifest["sources"])
    return (
        f"## Data\n\n{terms(manifest)}\n\n"
        f"- Files: {manifest['counts']['train']:,} train / {manifest['counts']['val']:,} validation "
        f"({total / 1e6:.1f} MB); {len(manifest['skipped']):,} skipped (non-UTF-8, empty, NUL bytes or duplicates).\n"
        f"- Manifest hash: `{manifest['files_sha256']}`\n"
        f"- Files per licence: " + ", ".join(f"{k} {v:,}" for k, v in files_per_licence.most_common()) + "\n\n"
        f"<details><summary>Sources ({len(manifest['sources'])})</summary>\n\n"
        "| source | version | licence |\n|---|---|---|\n"
        f"{rows}\n\n</details>\n"
    )


def lm_card(kind: str, report: dict, command: str, manifest: dict, held_out: dict | None, extra: str = "") -> str:
    c = report["config"]
    held = ""
    if held_out and kind in held_out["models"]:
        h = held_out["models"][kind]
        held = "".join(f"- Held-out loss on {name}: {v:.4f} nats/token\n" for name, v in h.items())
    return f"""---
library_name: transformers
pipeline_tag: text-generation
license: apache-2.0
tags: [draftverify, code, python, llama, speculative-decoding]
---

# draftverify code-{kind} ({report["parameters"] / 1e6:.2f}M parameters)

A small `LlamaForCausalLM` trained from scratch as the *{kind}* model of draftverify's code pair (speculative
decoding experiments). It completes Python source; it is a toy, not a general code assistant.

{data_section(manifest)}
## Model

- Parameters: {report["parameters"]:,} (tied input/output embeddings)
- hidden {c["hidden_size"]}, layers {c["num_hidden_layers"]}, heads {c["num_attention_heads"]} (kv \
{c["num_key_value_heads"]}), intermediate {c["intermediate_size"]}, max positions {c["max_position_embeddings"]}
- Tokenizer: the zoo's byte-level BPE (vocab {c["vocab_size"]}, `<|endoftext|>` = bos/eos), documents joined with eos.
- Weights in float16 (safetensors); trained in bf16 autocast with fp32 master weights.

## Training

```
{command}
```

- Hardware: one {report["device"]} (torch {report["torch"]}), lent to a development session for minutes.
- Sequence length {report["seq_len"]}, batch {report["batch"]} sequences, AdamW (0.9, 0.95), weight decay 0.1, peak LR \
{report["lr"]}, {report["warmup_steps"]} warm-up steps, cosine decay to 0.1x over the time budget, grad clip 1.0.
- Steps: {report["steps"]:,}; tokens seen: {report["tokens_seen"]:,} ({report["epochs"]:.2f} epochs of \
{report["train_tokens"]:,} training tokens)
- Training time: {report["train_minutes"]:.1f} min ({report["total_minutes"]:.1f} min with tokenization and export).
- Held-out loss: {report["val_loss_64x512"]:.4f} nats/token on 64 evenly spaced 512-token validation windows; \
{report["val_loss_all_windows"]:.4f} on all {report["val_windows_all"]:,} non-overlapping windows \
({report["val_tokens"]:,} validation tokens).
{held}{extra}
## Usage

```python
from transformers import AutoModelForCausalLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path)
```
"""


def code(argv: list[str]) -> None:
    """[ZOO]: the cards of ZOO/{target,draft,draft-aligned} (default zoo/code)."""
    zoo = Path(argv[0] if argv else "zoo/code")
    manifest = json.loads((zoo / "manifest.json").read_text())
    held_out = json.loads((zoo / "held_out.json").read_text()) if (zoo / "held_out.json").is_file() else None
    target = json.loads((zoo / "target" / "training_report.json").read_text())
    draft = json.loads((zoo / "draft" / "training_report.json").read_text())
    aligned = json.loads((zoo / "draft-aligned" / "alignment_report.json").read_text())
    gpu = "PYTHONPATH=src python scripts/gpu_zoo.py train --tokenizer zoo/code/tokenizer --bundle .gpu/corpus"
    early = (
        f"- Early exit (BiLD section 4.4): the last {target['early_exit_share']:.0%} of the budget trained on the "
        f"average of the final layer's loss and layer {target['early_exit_layer']}'s (through the shared norm and "
        f"head). Layer {target['early_exit_layer']}'s held-out loss went {target['before_early_exit_phase'][1]:.4f} -> "
        f"{target['val_loss_early_exit_64x512']:.4f}; the full model's {target['before_early_exit_phase'][0]:.4f} -> "
        f"{target['val_loss_64x512']:.4f} (kept: the bound is +{target['max_degradation']} nats). `--method early_exit "
        f"--early-exit-layers {target['early_exit_layer']}` uses it as a shared-weight small model.\n"
    )
    (zoo / "target" / "README.md").write_text(
        lm_card(
            "target",
            target,
            f"{gpu} --role target --out zoo/code/target --minutes 9 --early-exit-layer 2 --early-exit-share 0.2",
            manifest,
            held_out,
            early,
        )
    )
    (zoo / "draft" / "README.md").write_text(
        lm_card("draft", draft, f"{gpu} --role draft --out zoo/code/draft --minutes 7 --lr 2e-3", manifest, held_out)
    )
    aligned_card = lm_card(
        "draft", draft, f"{gpu} --role draft --out zoo/code/draft --minutes 7 --lr 2e-3", manifest, held_out
    ).replace("# draftverify code-draft", "# draftverify code-draft-aligned", 1)
    aligned_card += f"""
## Prediction alignment (BiLD section 3.2)

The draft above, fine-tuned on the target's own greedy continuations:

```
PYTHONPATH=src python scripts/gpu_zoo.py align --target zoo/code/target --draft zoo/code/draft \
--out zoo/code/draft-aligned \\
    --num-prompts {aligned["num_prompts"]} --minutes {aligned["train_minutes"]} --lr {aligned["lr"]}
```

- {aligned["num_prompts"]:,} prompts of {aligned["prompt_len"]} tokens from the training split, \
{aligned["new_tokens"]} target greedy tokens each (bf16 on the GPU, {aligned["generation_minutes"]:.1f} min); \
{aligned["steps"]:,} steps of {aligned["batch"]} sequences, loss on the continuation tokens only, on one \
{aligned["device"]}.
- Greedy agreement with the target on {aligned["val_prompts"]} held-out prompts (validation split), i.e. the greedy \
acceptance rate alpha: {aligned["greedy_agreement_before"]:.4f} before -> {aligned["greedy_agreement_after"]:.4f} after.
- The target's early-exit view (first {aligned["early_exit_layers"]} layers) on the same data: \
{aligned["early_exit_greedy_agreement"]:.4f}.
"""
    (zoo / "draft-aligned" / "README.md").write_text(aligned_card)
    print("cards written:", *(zoo / d / "README.md" for d in ("target", "draft", "draft-aligned")))


ROLES = {"target": "target", "draft": "small", "draft-aligned": "small-aligned"}


def translate(argv: list[str]) -> None:
    """The cards of zoo/translate (--rescore: measure BLEU / chrF again first)."""
    ap = argparse.ArgumentParser(prog="zoo_cards.py translate")
    ap.add_argument("--zoo", type=Path, default=Path("zoo/translate"))
    ap.add_argument("--data", default="../shared/data/multi30k_en_de")
    ap.add_argument("--rescore", action="store_true")
    ap.add_argument("--beam", type=int, default=0, help="with --rescore: also test_2016_flickr with this beam size")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--alignment-bench",
        type=Path,
        default=Path("benchmarks/translation/translate-bild-aligned.json"),
        help="reproduce specdec JSON with the original and aligned small models (draft-aligned's card)",
    )
    args = ap.parse_args(argv)
    for folder, role in ROLES.items():
        path = args.zoo / folder / "training_report.json"
        if not path.is_file():
            print(f"skip {folder}: no training_report.json")
            continue
        report = json.loads(path.read_text())
        report["role"] = role
        if folder == "draft-aligned" and args.alignment_bench.is_file():
            report["bild_alignment"] = json.loads(args.alignment_bench.read_text())
        if args.rescore:
            report["scores"] = rescore(args.zoo / folder, args.data, report["languages"], args.threads, args.beam)
            path.write_text(json.dumps(report, indent=1, default=str) + "\n")
        (args.zoo / folder / "README.md").write_text(model_card(report))
        print(
            f"{folder}: "
            + ", ".join(f"{k} BLEU {v['bleu']:.2f} chrF {v['chrf']:.2f}" for k, v in report["scores"].items())
        )
    nat = args.zoo / "nat" / "nat.json"
    if nat.is_file():
        (args.zoo / "nat" / "README.md").write_text(nat_card(json.loads(nat.read_text())))
        print("nat: card written")


def rescore(folder: Path, data: str, languages: list[str], threads: int, beam: int) -> dict:
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from draftverify.train.seq2seq import score_split

    torch.set_num_threads(threads)
    model = AutoModelForSeq2SeqLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(str(folder))
    src, tgt = languages
    scores = {
        "val": score_split(model, tok, data, "val", src, tgt),
        "test_2016_flickr": score_split(model, tok, data, "test_2016_flickr", src, tgt),
    }
    if beam > 1:
        scores[f"test_2016_flickr_beam{beam}"] = score_split(
            model, tok, data, "test_2016_flickr", src, tgt, num_beams=beam
        )
    return scores


def held_out(argv: list[str]) -> None:
    """Held-out losses of zoo models on validation splits: zoo/code/held_out.json and a markdown table."""
    import os

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from draftverify.train.corpus import load_manifest
    from draftverify.train.losses import evaluate
    from draftverify.train.tokens import fixed_windows, tokenize_split

    ap = argparse.ArgumentParser(prog="zoo_cards.py held-out")
    ap.add_argument("--model", action="append", default=[], help="name=path")
    ap.add_argument("--val", action="append", default=[], help="name=manifest.json")
    ap.add_argument("--markdown", type=Path, default=Path("benchmarks/zoo/zoo-held-out.md"))
    ap.add_argument("--from-json", type=Path, default=None)
    ap.add_argument("--tokenizer", default="zoo/code/tokenizer")
    ap.add_argument("--out", type=Path, default=Path("zoo/code/held_out.json"))
    args = ap.parse_args(argv)
    if args.from_json is not None:
        args.markdown.write_text(held_out_markdown(json.loads(args.from_json.read_text())))
        return
    torch.set_num_threads(2)
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    windows = {}
    for spec in args.val:
        name, path = spec.split("=", 1)
        manifest = load_manifest(path)
        windows[name] = fixed_windows(tokenize_split(manifest, tok, "val", tok.eos_token_id), 64, 512)
    result = {
        "definition": "mean next-token cross-entropy (nats) over 64 evenly spaced 512-token windows of the "
        "validation split, fp32 on CPU",
        "validation_sets": {s.split("=")[0]: os.path.relpath(s.split("=")[1]) for s in args.val},
        "models": {},
    }
    for spec in args.model:
        name, path = spec.split("=", 1)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        result["models"][name] = {v: evaluate(model, w, bf16=False, batch_size=8) for v, w in windows.items()}
        print(name, {k: round(x, 4) for k, x in result["models"][name].items()}, flush=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    args.markdown.write_text(held_out_markdown(result))


def held_out_markdown(result: dict) -> str:
    sets = list(result["validation_sets"])
    lines = [
        "# Held-out loss of the zoo models",
        "",
        result["definition"] + "; written by `scripts/zoo_cards.py held-out`.",
        "",
        "| model | " + " | ".join(f"val: {s}" for s in sets) + " |",
        "|---|" + "---|" * len(sets),
    ]
    lines += [f"| `{m}` | " + " | ".join(f"{v[s]:.3f}" for s in sets) + " |" for m, v in result["models"].items()]
    return "\n".join(lines) + "\n"


STEPS = {"code": code, "translate": translate, "held-out": held_out}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in STEPS:
        raise SystemExit(f"usage: zoo_cards.py {{{','.join(STEPS)}}} ...")
    STEPS[sys.argv[1]](sys.argv[2:])

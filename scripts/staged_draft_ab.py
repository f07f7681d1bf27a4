"""Staged drafting on and off, side by side in one process: `model` on both backends with lookup_tokens 0 (one
draft token per draft forward), 3, 5 and 10 (drafters/model.py ModelDrafter.looked_up). The proposals are the
draft model's own tokens either way, so the text and the tokens per target call must not change; the script stops
if a text differs. Lookup's agreement as confidence (ModelDrafter.lookup_confirms, which needs staged drafting) is
off in every setting, so only the draft forwards differ (scripts/lookup_agreement_ab.py measures it). Rows: the HF backend with the zoo draft at gamma conf, the llama.cpp backend with the aligned
draft at conf=0.8 (the bench's best rows). Prompts alternate the order of the settings; several rounds.

Usage: python scripts/staged_draft_ab.py [--prompts 8] [--rounds 3]
Writes benchmarks/staged-draft-ab.md (and prints it)."""
from __future__ import annotations

from pathlib import Path

import torch

from draftverify import DraftVerifyError, load
from draftverify.bench.environment import machine, now
from draftverify.bench.prompts import default_data_dir, load_humaneval
from ab_options import ab_parser, write_report

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = (0, 3, 5, 10)
ROWS = (("hf", "draft", "conf"), ("llamacpp", "draft-aligned", "conf=0.8"))


def main() -> None:
    ap = ab_parser()
    args = ap.parse_args()
    torch.set_num_threads(2)
    prompts = [p.text for p in load_humaneval(default_data_dir())[: args.prompts]]
    lines = []
    for backend, draft, gamma in ROWS:
        try:
            pipes = {k: load(zoo="code", draft=ROOT / "zoo" / "code" / draft, method="model", backend=backend,
                             gamma=gamma, threads=2) for k in SETTINGS}
        except DraftVerifyError as err:
            ap.exit(2, f"error: {err}\n")
        for k, pipe in pipes.items():
            pipe.drafter.lookup_tokens = k
            pipe.drafter.lookup_confirms = False  # staging alone: the same draft lengths in every setting
            pipe.generate(prompts[0], max_new_tokens=32)  # warm-up
        totals = {k: [0, 0, 0, 0.0] for k in SETTINGS}  # new tokens, target calls, draft forwards, seconds
        for _ in range(args.rounds):
            for i, text in enumerate(prompts):
                order = SETTINGS[i % len(SETTINGS):] + SETTINGS[: i % len(SETTINGS)]
                texts = set()
                for k in order:
                    result = pipes[k].generate(text, max_new_tokens=128)
                    stats = result.output.stats
                    texts.add(result.text)
                    total = totals[k]
                    total[0] += stats.new_tokens
                    total[1] += stats.target_calls
                    total[2] += stats.draft_calls
                    total[3] += stats.time_total
                if len(texts) != 1:
                    raise SystemExit(f"{backend}, prompt {i}: the settings gave different texts")
        base = totals[0][0] / totals[0][3]
        for k in SETTINGS:
            new, calls, forwards, seconds = totals[k]
            lines.append(f"| {backend} | `{draft}` | {gamma} | {k} | {new / seconds:.1f} | {new / seconds / base:.3f}x "
                         f"| {new / calls:.2f} | {forwards} |")
    m = machine()
    text = "\n".join([
        "# Staged drafting on and off", "",
        f"`python scripts/staged_draft_ab.py --prompts {args.prompts} --rounds {args.rounds}`; {now()}; "
        f"{m['cpu_model']} ({m['cores']} cores), 2 threads; `model` on the zoo target, HumanEval prompts "
        f"0..{len(prompts) - 1} x 128 tokens, greedy, {args.rounds} rounds in one process, the settings alternating "
        "prompt by prompt; every setting gave the same text on every prompt. lookup tokens 0: one draft token per "
        "draft forward; N: each draft forward also scores up to N prompt-lookup tokens and keeps those equal to "
        "the draft's own choices (lookup's agreement as confidence off in every setting).", "",
        "| backend | draft | gamma | lookup tokens | tok/s | vs 0 | tokens / call | draft forwards |",
        "|---|---|---|---:|---:|---:|---:|---:|", *lines, ""])
    write_report("staged-draft-ab.md", text)


if __name__ == "__main__":
    main()

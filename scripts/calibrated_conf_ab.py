"""A/B of gamma `conf`'s calibrated threshold (draft_length.ConfidenceCalibration: the draft ends at its first token
whose max q is accepted less often than 0.85, learned from the run) against the fixed `conf=0.4`, for the code zoo's
draft and its BiLD-aligned twin (a draft sure of itself), alternating prompt by prompt in one process. Each
(draft, gamma) is its own pipeline, so each keeps its own policy across the prompts (as a user's would); the text is
the target's greedy text every time (checked).

Usage: python scripts/calibrated_conf_ab.py [--backends llamacpp,hf] [--prompts 8] [--rounds 3]
Writes benchmarks/calibrated-conf.md (and prints it)."""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from draftverify import DraftVerifyError, load
from draftverify.bench.environment import machine, now
from draftverify.bench.prompts import default_data_dir, load_humaneval

ROOT = Path(__file__).resolve().parents[1]
DRAFTS = ("draft", "draft-aligned")
GAMMAS = ("conf", "conf=0.4")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backends", default="llamacpp,hf")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if args.prompts < 1 or args.rounds < 1:
        ap.exit(2, "error: --prompts and --rounds must be at least 1\n")
    torch.set_num_threads(2)
    prompts = [p.text for p in load_humaneval(default_data_dir())[: args.prompts]]
    lines = []
    for backend in args.backends.split(","):
        extra = {"backend": backend, "threads": 2} if backend != "hf" else {}
        try:
            pipes = {(d, g): load(zoo="code", draft=ROOT / "zoo" / "code" / d, method="model", gamma=g, **extra)
                     for d in DRAFTS for g in GAMMAS}
        except DraftVerifyError as err:
            ap.exit(2, f"error: {err}\n")
        for pipe in pipes.values():
            pipe.generate(prompts[0], max_new_tokens=16)  # warm-up, as the bench does
        totals = {key: [0, 0.0, 0, 0] for key in pipes}
        texts: dict[int, list[int]] = {}
        keys = list(pipes)
        for r in range(args.rounds):
            for i, text in enumerate(prompts):
                shift = (r * len(prompts) + i) % len(keys)
                for key in keys[shift:] + keys[:shift]:
                    started = time.perf_counter()
                    out = pipes[key].generate(text, max_new_tokens=128).output
                    seconds = time.perf_counter() - started
                    ids = out.new_tokens[0].tolist()
                    if texts.setdefault(i, ids) != ids:
                        raise SystemExit(f"prompt {i}: {key} gave another text")
                    t = totals[key]
                    t[0] += len(ids)
                    t[1] += seconds
                    t[2] += out.stats.target_calls
                    t[3] += out.stats.draft_calls
        base = totals[("draft", "conf=0.4")]
        for (d, g), (n, s, calls, forwards) in totals.items():
            policy = pipes[(d, g)].policies.get(g, 0.0)
            lines.append(f"| {backend} | `{d}` | `{g}` | {policy.confidence:.2f} | {n / s:.1f} | "
                         f"{(n / s) / (base[0] / base[1]):.2f}x | {n / calls:.2f} | {forwards / calls:.2f} |")
        del pipes
    m = machine()
    text = "\n".join([
        "# gamma conf: the calibrated threshold against the fixed 0.4", "",
        f"`python scripts/calibrated_conf_ab.py --backends {args.backends} --prompts {args.prompts} --rounds "
        f"{args.rounds}`; {now()}; {m['cpu_model']} ({m['cores']} cores), 2 threads; the code zoo's target with its "
        f"draft and its BiLD-aligned draft (llama.cpp: f32 target GGUF, q8_0 drafts); `model`, {args.prompts} "
        f"HumanEval prompts x 128 tokens, greedy, after one 16-token warm-up; one pipeline per (draft, gamma), all "
        f"alternating prompt by prompt over {args.rounds} rounds in one process; the target's greedy text every time.",
        "", "**threshold**: the policy's max-q threshold at the end of the run (`conf`: calibrated, "
        "draft_length.ConfidenceCalibration; `conf=0.4`: as given). **vs draft, conf=0.4**: tok/s over that row of "
        "the same backend.", "",
        "| backend | draft | gamma | threshold | tok/s | vs draft, conf=0.4 | tokens / call | draft forwards / call |",
        "|---|---|---|---:|---:|---:|---:|---:|", *lines, ""])
    out = ROOT / "benchmarks" / "calibrated-conf.md"
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()

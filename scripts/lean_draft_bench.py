"""The code zoo's draft model on the lean backend vs CachedLM, side by side in one process, into
benchmarks/lean-draft.{md,json}:

1. one forward of n = 1, 2, 4, 8 tokens after a --context-token context, ms (median of every timed call): LeanLM,
   CachedLM as it runs (few-row torch function mode for 2..8 rows), and CachedLM without that mode;
2. `model` with gamma `conf` on --prompts HumanEval prompts: the lean draft vs the same draft on CachedLM, two
   pipelines sharing the target, alternating in --rounds rounds; tokens/s, tokens per target call, draft ms per
   draft forward, and whether the texts are equal (they must be: the target verifies).

Variants take turns within every round (the order flips each round), so load from other processes on a shared
machine hits them alike; the ratios are the result, the absolute numbers move with the machine's load (the load
average is recorded).

Usage: python scripts/lean_draft_bench.py [--threads 2] [--rounds 6] [--reps 40] [--context 120] [--prompts 4]
       [--new-tokens 128] [--out benchmarks]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
from pathlib import Path
from time import perf_counter

import torch
import transformers

from draftverify.api import Pipeline, load_model, load_tokenizer, zoo_paths
from draftverify.backends.lean import LeanLM
from draftverify.bench.prompts import default_data_dir, load_humaneval
from draftverify.cached_lm import CachedLM
from draftverify.few_row_linear import ENV_SWITCH as FEW_ROW_SWITCH
from draftverify.methods import MethodOptions

WIDTHS = (1, 2, 4, 8)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class NoFewRowMode:
    """CachedLM with the few-row torch function mode switched off around its forwards."""

    def __init__(self, lm: CachedLM):
        self.lm = lm

    def start(self, ids):
        return self.lm.start(ids)

    def forward(self, tokens):
        os.environ[FEW_ROW_SWITCH] = "0"
        try:
            return self.lm.forward(tokens)
        finally:
            os.environ.pop(FEW_ROW_SWITCH)

    def commit(self, kept):
        self.lm.commit(kept)


@torch.inference_mode()
def per_forward(draft_model, context: torch.Tensor, rounds: int, reps: int) -> dict:
    """ms per forward at each width for each variant: {variant: {width: median ms}}."""
    variants = {"lean": LeanLM(draft_model), "cached": CachedLM(draft_model, role="draft"),
                "cached, no few-row mode": NoFewRowMode(CachedLM(draft_model, role="draft"))}
    seconds = {name: {w: [] for w in WIDTHS} for name in variants}
    names = list(variants)
    for lm in variants.values():
        lm.start(context)
    for r in range(rounds):
        for width in WIDTHS:
            tokens = context[:, -width:]
            for i in range(reps + 3):  # the variants take turns call by call: a burst of load hits them alike
                for name in names if (r + i) % 2 == 0 else names[::-1]:
                    lm = variants[name]
                    begun = perf_counter()
                    lm.forward(tokens)
                    if i >= 3:  # the first calls warm the allocator and caches
                        seconds[name][width].append(perf_counter() - begun)
                    lm.commit(0)  # roll back: every call scores the same tokens after the same context
    return {name: {w: 1000 * statistics.median(s) for w, s in by_width.items()} for name, by_width in seconds.items()}


def generation(target, draft, tokenizer, prompts: list[str], rounds: int, new_tokens: int) -> dict:
    """model[conf] with the lean draft on and off, alternating; totals per variant and per-round tok/s ratios."""
    pipes = {flag: Pipeline(target, tokenizer, "model", options=MethodOptions(draft_model=draft, lean_draft=flag),
                            gamma="conf") for flag in (True, False)}
    for pipe in pipes.values():
        pipe.generate(prompts[0], max_new_tokens=16)  # warm-up (and the first conf calibration)
    totals = {flag: dict(tokens=0, seconds=0.0, target_calls=0, draft_calls=0, draft_seconds=0.0) for flag in pipes}
    texts: dict[bool, list[str]] = {flag: [] for flag in pipes}
    ratios = []
    for r in range(rounds):
        rate = {}
        for flag in (True, False) if r % 2 == 0 else (False, True):
            tokens = seconds = 0.0
            for prompt in prompts:
                result = pipes[flag].generate(prompt, max_new_tokens=new_tokens)
                s = result.stats
                tokens += s.new_tokens
                seconds += s.time_total
                t = totals[flag]
                t["target_calls"] += s.target_calls
                t["draft_calls"] += s.draft_calls
                t["draft_seconds"] += s.time_draft
                if r == 0:
                    texts[flag].append(result.text)
            totals[flag]["tokens"] += tokens
            totals[flag]["seconds"] += seconds
            rate[flag] = tokens / seconds
        ratios.append(rate[True] / rate[False])
    out = {}
    for flag, t in totals.items():
        out["lean" if flag else "off"] = dict(
            tok_per_s=t["tokens"] / t["seconds"], tokens_per_call=t["tokens"] / t["target_calls"],
            draft_calls_per_target_call=t["draft_calls"] / t["target_calls"],
            draft_ms_per_forward=1000 * t["draft_seconds"] / max(t["draft_calls"], 1))
    # the median round: a burst of load from another process in one round does not move it
    out["ratio_tok_per_s"] = statistics.median(ratios)
    out["ratio_tokens_per_call"] = out["lean"]["tokens_per_call"] / out["off"]["tokens_per_call"]
    out["round_ratios"] = ratios
    out["texts_equal"] = texts[True] == texts[False]
    return out


def markdown(result: dict) -> str:
    fwd, gen, env = result["per_forward_ms"], result["generation"], result["environment"]
    lines = [
        "# The lean draft backend vs CachedLM (code zoo draft)",
        "",
        f"`python scripts/lean_draft_bench.py --threads {env['threads']} --rounds {env['rounds']} --reps {env['reps']} "
        f"--context {env['context']} --prompts {env['prompts']} --new-tokens {env['new_tokens']}`; torch "
        f"{env['torch']}, transformers {env['transformers']}, {env['cpu']}; load average {env['load_before']:.1f} "
        f"before, {env['load_after']:.1f} after ({env['cores']} cores; other processes may share them: read the ratios).",
        "",
        "## Milliseconds per draft forward",
        "",
        f"One draft forward of n tokens after {env['context']} tokens of context (ms, median):",
        "",
        "| n | LeanLM | CachedLM | CachedLM, no few-row mode | CachedLM / LeanLM | mode on / off |",
        "|---|---|---|---|---|---|",
    ]
    for w in WIDTHS:
        lean, cached, plain = (fwd[k][w] for k in ("lean", "cached", "cached, no few-row mode"))
        lines.append(f"| {w} | {lean:.3f} | {cached:.3f} | {plain:.3f} | {cached / lean:.2f}x | {cached / plain:.2f}x |")
    lines += [
        "",
        "## Generation",
        "",
        f"`model` at gamma `conf`, {env['prompts']} HumanEval prompts x {env['new_tokens']} new tokens, greedy, "
        f"{env['rounds']} alternating rounds:",
        "",
        "| draft backend | tok/s (all rounds) | tokens / target call | draft forwards / target call | "
        "draft ms / forward |",
        "|---|---|---|---|---|",
    ]
    for key, label in (("lean", "LeanLM"), ("off", "CachedLM (lean off)")):
        g = gen[key]
        lines.append(f"| {label} | {g['tok_per_s']:.1f} | {g['tokens_per_call']:.2f} | "
                     f"{g['draft_calls_per_target_call']:.2f} | {g['draft_ms_per_forward']:.3f} |")
    lean, off = gen["lean"], gen["off"]
    lines.append(f"| lean / off | {gen['ratio_tok_per_s']:.2f}x | {gen['ratio_tokens_per_call']:.2f}x | "
                 f"{lean['draft_calls_per_target_call'] / off['draft_calls_per_target_call']:.2f}x | "
                 f"{lean['draft_ms_per_forward'] / off['draft_ms_per_forward']:.2f}x |")
    rounds = ", ".join(f"{r:.2f}" for r in gen["round_ratios"])
    lines += [
        "",
        f"The lean / off row's tok/s is the median of the rounds' ratios ({rounds}); texts equal (lean vs off, every prompt): {gen['texts_equal']}. "
        "Draft ms / forward is the drafter's whole time per draft forward (sampling and the confidence test "
        "included).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument("--context", type=int, default=120)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "benchmarks")
    parser.add_argument("--name", default="lean-draft")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    paths = zoo_paths("code")
    tokenizer = load_tokenizer(paths["target"])
    target, draft = load_model(paths["target"], role="target"), load_model(paths["draft"], role="draft")
    prompts = [p.text for p in load_humaneval(default_data_dir())[: args.prompts]]
    context = tokenizer("\n".join(prompts), return_tensors="pt").input_ids[:, : args.context]
    result = {
        "per_forward_ms": per_forward(draft, context, args.rounds, args.reps),
        "generation": generation(target, draft, tokenizer, prompts, args.rounds, args.new_tokens),
    }
    result["environment"] = dict(threads=args.threads, rounds=args.rounds, reps=args.reps, context=context.shape[1],
                                 prompts=len(prompts), new_tokens=args.new_tokens, torch=torch.__version__, cores=os.cpu_count(),
                                 transformers=transformers.__version__, cpu=cpu_name(),
                                 load_before=load_before, load_after=os.getloadavg()[0])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    text = markdown(result)
    (args.out / f"{args.name}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()

"""Draft-length policies compared without a quiet machine: the real models and our loop, but every timing the
policy reads (and the time reported) is modelled from the idle machine's measurements.

Tokens per call and draft forwards are counts, so they do not depend on the machine; what a timing-driven policy
(`auto`, `conf`) chooses does, and on a shared CPU its choices follow the neighbours' load. Here the policy hears
modelled timings instead: a target call over n tokens costs the measured eager-float32 cost curve
(benchmarks/cost-code.json, medians, made non-decreasing), a draft forward --draft-ms (bench-humaneval.md: `model[g=4]`
drafts 4 tokens in 13.9 ms), and each step --overhead-ms of loop work. The modelled tokens/s is computed the same way.

Usage: python scripts/draft_length_replay.py [--method model|lookup_model] [--gammas auto,conf,4,hf-rule]
           [--prompts 8] [--new-tokens 128] [--temperature 0]
(hf-rule: Hugging Face assisted generation's default rule in our loop, a fixed cap of 20 and the stop at 0.4;
slackS: `conf` taking the longest cap within S of the best expected speed, e.g. slack0 for the strict optimum.)
Prints one markdown row per gamma: tokens per call, draft forwards per token, target calls, modelled tokens/s and
its ratio to Hugging Face generate's measured 36.3 tokens/s (bench-humaneval.md, same machine).
"""
import argparse
import json
from pathlib import Path

import torch

from draftverify import SamplingParams, generate
from draftverify.api import load_model, load_tokenizer, zoo_paths
from draftverify.bench.prompts import load_prompts
from draftverify.cached_lm import CachedLM
from draftverify.draft_length import ConfidenceGamma, DraftLength, make_draft_length
from draftverify.drafters import LookupModelDrafter, ModelDrafter
from draftverify.verifiers.exact import ExactVerifier

ROOT = Path(__file__).resolve().parents[1]
HF_GENERATE_TOKENS_PER_SECOND = 36.3  # benchmarks/bench-humaneval.md, greedy, idle machine


def cost_curve(path: Path) -> list[tuple[int, float]]:
    """(tokens, seconds) of one eager-float32 target call, non-decreasing."""
    points = json.loads(path.read_text())["modes"]["eager-float32"]["points"]
    curve, top = [], 0.0
    for p in sorted(points, key=lambda p: p["n"]):
        top = max(top, p["median_ms"] / 1000)
        curve.append((p["n"], top))
    return curve


def seconds_for(curve: list[tuple[int, float]], n: int) -> float:
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if n <= x1:
            return y0 + (y1 - y0) * (n - x0) / (x1 - x0)
    return curve[-1][1]


class Modelled(DraftLength):
    """Wraps a policy: it hears modelled timings instead of this machine's."""

    def __init__(self, inner: DraftLength, curve, draft_seconds: float):
        self.inner, self.curve, self.draft_seconds = inner, curve, draft_seconds
        self.confidence, self.reads_timers = inner.confidence, inner.reads_timers

    def next(self, rows: int = 1) -> int:
        return self.inner.next(rows)

    def update(self, drafted, accepted, rejected, draft_seconds, target_seconds, rows=1) -> None:
        self.inner.update(drafted, accepted, rejected, drafted * self.draft_seconds,
                          seconds_for(self.curve, rows * (drafted + 1)), rows)

    def update_rows(self, lengths, accepted) -> None:
        self.inner.update_rows(lengths, accepted)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", choices=("model", "lookup_model"), default="model")
    parser.add_argument("--gammas", default="auto,conf,4,hf-rule")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--draft-ms", type=float, default=13.9 / 4)
    parser.add_argument("--overhead-ms", type=float, default=2.0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    paths = zoo_paths("code")
    tokenizer = load_tokenizer(paths["target"])
    target = CachedLM(load_model(paths["target"]), role="target")
    draft = ModelDrafter(load_model(paths["draft"], role="draft"))
    drafter = draft if args.method == "model" else LookupModelDrafter(draft.lm, 3, 2)
    curve = cost_curve(ROOT / "benchmarks" / "cost-code.json")
    prompts = [tokenizer(p.text, return_tensors="pt").input_ids for p in load_prompts("humaneval", None)[: args.prompts]]
    params = SamplingParams(temperature=args.temperature, seed=0 if args.temperature > 0 else None, coupling=False)
    print(f"{args.method}, {len(prompts)} HumanEval prompts x {args.new_tokens} tokens, temperature {args.temperature:g}")
    print("| gamma | tokens/call | draft forwards/token | target calls | modelled tok/s | x HF generate |")
    print("|---|---|---|---|---|---|")
    for gamma in args.gammas.split(","):
        new = calls = forwards = 0
        seconds = 0.0
        for ids in prompts:
            if gamma.startswith("slack"):
                inner = ConfidenceGamma(0.4, slack=float(gamma[5:]))
            else:
                inner = ConfidenceGamma(0.4, fixed=20) if gamma == "hf-rule" else \
                    make_draft_length(int(gamma) if gamma.isdecimal() else gamma)
            policy = Modelled(inner, curve, args.draft_ms / 1000)
            stats = generate(target, drafter, ExactVerifier(params), ids, params, max_new_tokens=args.new_tokens,
                             gamma=policy, eos_token_id=tokenizer.eos_token_id).stats
            new, calls, forwards = new + stats.new_tokens, calls + stats.target_calls, forwards + stats.draft_calls
            seconds += stats.draft_calls * args.draft_ms / 1000 + stats.target_calls * args.overhead_ms / 1000
            seconds += sum(seconds_for(curve, g + 1) for g in stats.gammas)
        rate = new / seconds
        print(f"| {gamma} | {new / calls:.2f} | {forwards / new:.3f} | {calls} | {rate:.1f} | "
              f"{rate / HF_GENERATE_TOKENS_PER_SECOND:.2f}x |", flush=True)


if __name__ == "__main__":
    main()

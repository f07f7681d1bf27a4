"""Tokens per target call of SpecDec's NAT drafter on the code zoo (decoder-only target), next to prompt lookup and
lookup_model on the same HumanEval prompts, greedy; every method's text is checked against plain autoregressive
decoding in our loop. Counts only (no timings: `draftverify bench --runners specdec,...` on an idle machine times
them). Writes benchmarks/specdec-code-counts.md.

Usage: python scripts/specdec_counts.py [--prompts 8] [--new-tokens 64] [--gammas 4,8] [--nat zoo/code/nat]
"""
import argparse
from pathlib import Path

import torch

from draftverify import SamplingParams, generate
from draftverify.api import load_model, load_tokenizer, zoo_paths
from draftverify.bench.prompts import load_prompts
from draftverify.cached_lm import CachedLM
from draftverify.methods import METHODS, MethodOptions, build_drafter, build_verifier

ROOT = Path(__file__).resolve().parents[1]
METHOD_NAMES = ("prompt_lookup", "lookup_model", "specdec")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=8, help="the first N HumanEval prompts")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--gammas", default="4,8")
    parser.add_argument("--nat", default=None, help="NAT drafter folder (default: the zoo's)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "specdec-code-counts.md"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    paths = zoo_paths("code")
    tokenizer = load_tokenizer(paths["target"])
    target = CachedLM(load_model(paths["target"]), role="target")
    options = MethodOptions(draft_model=CachedLM(load_model(paths["draft"], role="draft"), role="draft"),
                            nat_path=args.nat or paths["nat"])
    greedy = SamplingParams()
    prompts = [tokenizer(p.text, return_tensors="pt").input_ids for p in load_prompts("humaneval")[: args.prompts]]
    eos = tokenizer.eos_token_id

    def run(method: str, gamma: int) -> tuple[list[list[int]], int, int]:
        texts, tokens, calls = [], 0, 0
        for ids in prompts:
            drafter = build_drafter(METHODS[method].drafter, target, options)
            verifier = build_verifier(METHODS[method].verifier, greedy, options)
            out = generate(target, drafter, verifier, ids, greedy, max_new_tokens=args.new_tokens, gamma=gamma,
                           eos_token_id=eos)
            texts.append(out.new_tokens[0].tolist())
            tokens, calls = tokens + out.stats.new_tokens, calls + out.stats.target_calls
        return texts, tokens, calls

    reference, _, _ = run("autoregressive", 1)
    gammas = [int(g) for g in args.gammas.split(",")]
    lines = ["# SpecDec's NAT drafter on the code zoo: counts", "",
             f"`python scripts/specdec_counts.py --prompts {args.prompts} --new-tokens {args.new_tokens} --gammas "
             f"{args.gammas}`: the first {args.prompts} HumanEval prompts, greedy, {args.new_tokens} new tokens; "
             f"NAT drafter `{options.nat_path}`.", "",
             "| method | gamma | tokens per target call | text = autoregressive |", "|---|---|---|---|"]
    for method in METHOD_NAMES:
        for gamma in gammas:
            texts, tokens, calls = run(method, gamma)
            same = sum(a == b for a, b in zip(texts, reference))
            lines.append(f"| {method} | {gamma} | {tokens / calls:.2f} | {same}/{len(texts)} |")
            print(lines[-1], flush=True)
    Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

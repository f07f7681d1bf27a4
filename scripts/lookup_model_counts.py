"""Tokens per target call and draft-model calls per token of the draft model, prompt lookup and their
combination (lookup_model, by minimum match length) on the code zoo, greedy and coupled T=0.8; writes
benchmarks/lookup-model-counts.md. Counts only (no timings): it picks lookup_model's default match length,
and the cold-start timings (scripts/cold_start.py) decide between methods.

Usage: python scripts/lookup_model_counts.py [--new-tokens 96] [--gamma 4]
"""
import argparse
from pathlib import Path

import torch

from draftverify import SamplingParams, generate
from draftverify.api import load_model, load_tokenizer, zoo_paths
from draftverify.drafters import LookupModelDrafter, ModelDrafter, PromptLookupDrafter
from draftverify.verifiers import GreedyVerifier, GumbelCouplingVerifier

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["def quicksort(xs):\n", "class Stack:\n    def __init__(self):\n",
           "import os\n\ndef list_python_files(root):\n", "def parse_args(argv):\n    parser = argparse.ArgumentParser("]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--gamma", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    paths = zoo_paths("code")
    tokenizer, target, draft = load_tokenizer(paths["target"]), load_model(paths["target"]), load_model(paths["draft"], role="draft")
    drafters = {"model": lambda: ModelDrafter(draft), "prompt_lookup": lambda: PromptLookupDrafter(3, 1),
                **{f"lookup_model (min n-gram {n})": (lambda n=n: LookupModelDrafter(draft, 3, n)) for n in (1, 2, 3)}}
    lines = ["# lookup_model vs its two halves: counts on the code zoo", "",
             f"`python scripts/lookup_model_counts.py --new-tokens {args.new_tokens} --gamma {args.gamma}`: "
             f"{len(PROMPTS)} prompts, gamma {args.gamma}; T=0.8 is coupled sampling (seed = prompt index).", "",
             "| sampling | drafter | tokens per target call | draft-model calls per token |", "|---|---|---|---|"]
    for temperature in (0.0, 0.8):
        for name, make in drafters.items():
            tokens = calls = draft_calls = 0
            for i, prompt in enumerate(PROMPTS):
                ids = tokenizer(prompt, return_tensors="pt").input_ids
                params = SamplingParams(temperature=temperature, seed=i if temperature else None)
                verifier = GreedyVerifier() if params.greedy else GumbelCouplingVerifier()
                s = generate(target, make(), verifier, ids, params, max_new_tokens=args.new_tokens, gamma=args.gamma).stats
                tokens, calls, draft_calls = tokens + s.new_tokens, calls + s.target_calls, draft_calls + s.draft_calls
            lines.append(f"| {'greedy' if temperature == 0 else f'T={temperature}'} | {name} | {tokens / calls:.2f} "
                         f"| {draft_calls / tokens:.2f} |")
            print(lines[-1], flush=True)
    (ROOT / "benchmarks" / "lookup-model-counts.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

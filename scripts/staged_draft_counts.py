"""How many draft-model forwards staged drafting would save, counted on recorded drafts (a lead, not a method yet).

Staged drafting (Spector & Re, "Accelerating LLM inference with staged speculative decoding", 2023, in the form
that keeps the draft's own proposals): each draft forward also scores a prompt-lookup continuation of the text so
far, and the draft keeps every looked-up token equal to its own greedy choice, so one forward yields 1 + m draft
tokens. The proposals are the draft model's greedy tokens exactly, so tokens per target call and the output do not
change; only the number of draft forwards (and their widths) does.

The script runs `model` with the zoo's aligned draft at conf=0.8 on the llama.cpp backend (the bench's best row)
over HumanEval prompts, records each step's committed tokens and draft, replays staged drafting over them with the
library's lookup (drafters/prompt_lookup.find_continuation, lookup_model's n-gram lengths) and times a draft
forward at the widths the replay used. Usage: python scripts/staged_draft_counts.py [--prompts 8] [--lookup 10]
Writes benchmarks/staged-draft-counts-<lookup>.md (and prints it)."""
from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path
from time import perf_counter

import torch

from draftverify import load
from draftverify.bench.environment import machine, now
from draftverify.bench.prompts import default_data_dir, load_humaneval
from draftverify.drafters.model import ModelDrafter
from draftverify.drafters.prompt_lookup import find_continuation
from draftverify.methods import MethodOptions
from ab_options import ab_parser, at_least_one, write_report

ROOT = Path(__file__).resolve().parents[1]
NEW_TOKENS = 128
LOOKUP_TOKENS = 10  # looked-up tokens scored beside each draft forward (llama-cpp-python's lookup default)


def record(pipe, prompts: list[str]) -> list[tuple[list[int], list[int]]]:
    """(committed tokens, the draft's tokens) of every drafting step of the pipeline's generations."""
    steps = []
    propose = ModelDrafter.propose

    def recorded(self, state, gamma):
        draft = propose(self, state, gamma)
        n = int(draft.lengths[0]) if draft.lengths is not None else draft.length
        steps.append((state.tokens[0].tolist(), draft.tokens[0, :n].tolist()))
        return draft

    ModelDrafter.propose = recorded
    try:
        for text in prompts:
            pipe.generate(text, max_new_tokens=NEW_TOKENS)
    finally:
        ModelDrafter.propose = propose
    return steps


def staged_widths(steps, max_ngram: int, min_ngram: int, lookup: int) -> tuple[list[int], list[list[int]]]:
    """Per step: the draft forwards now (its length) and the widths of its staged forwards (the fed token plus the
    looked-up ones; the first forward of a step is the one right after the target's verify)."""
    lengths, widths = [], []
    for context, draft in steps:
        lengths.append(len(draft))
        step, i = [], 0
        while i < len(draft):  # the forward that yields draft[i] also scores a lookup of draft[i], draft[i+1], ...
            found = find_continuation(torch.tensor(context + draft[:i]), max_ngram, min_ngram, lookup).tolist()
            kept = 0
            while kept < len(found) and i + kept < len(draft) - 1 and found[kept] == draft[i + kept]:
                kept += 1
            step.append(1 + len(found))
            i += 1 + kept
        widths.append(step)
    return lengths, widths


def forward_ms(pipe, context: list[int], width: int, after_verify: bool, repeats: int = 30) -> float:
    """Median ms of one draft forward over `width` tokens after `context`: right after a target verify (the first
    forward of a step, when the target's weights have just passed through the cache) or after another draft
    forward (the rest)."""
    draft, target = pipe.drafter.lm, pipe.target
    draft.start(torch.tensor([context]))
    target.start(torch.tensor([context]))
    times = []
    for _ in range(repeats):
        if after_verify:
            target.forward(torch.tensor([context[-8:]]))
            target.commit(0)
        else:
            draft.forward(torch.tensor([context[-1:]]))
            draft.commit(0)
        started = perf_counter()
        draft.forward(torch.tensor([context[-width:]]))
        times.append(perf_counter() - started)
        draft.commit(0)
    return 1000 * statistics.median(times)


def main() -> None:
    ap = ab_parser(rounds=None)
    ap.add_argument("--lookup", type=at_least_one, default=LOOKUP_TOKENS, help="looked-up tokens per draft forward")
    args = ap.parse_args()
    torch.set_num_threads(2)
    pipe = load(zoo="code", draft=ROOT / "zoo" / "code" / "draft-aligned", method="model", backend="llamacpp",
                gamma="conf=0.8", threads=2)
    prompts = [p.text for p in load_humaneval(default_data_dir())[: args.prompts]]
    pipe.generate(prompts[0], max_new_tokens=32)
    steps = record(pipe, prompts)
    options = MethodOptions()
    lengths, widths = staged_widths(steps, options.prompt_lookup_max_ngram, options.lookup_model_min_ngram,
                                   args.lookup)
    context = pipe.encode(prompts[0])[0, :120].tolist()
    used = sorted({w for step in widths for w in step} | {1})
    cold = {w: forward_ms(pipe, context, w, after_verify=True) for w in used}
    warm = {w: forward_ms(pipe, context, w, after_verify=False) for w in used}
    forwards, staged = sum(lengths), sum(len(step) for step in widths)
    now_ms = sum(cold[1] + (n - 1) * warm[1] for n in lengths)
    staged_ms = sum(cold[step[0]] + sum(warm[w] for w in step[1:]) for step in widths)
    count = Counter(w for step in widths for w in step)
    m = machine()
    text = "\n".join([
        "# Staged drafting, replayed on recorded drafts", "",
        f"`python scripts/staged_draft_counts.py --prompts {args.prompts} --lookup {args.lookup}`; {now()}; {m['cpu_model']} "
        f"({m['cores']} cores), 2 threads; `llamacpp:model_aligned[conf=0.8]` (the zoo target as f32 GGUF, the "
        f"aligned draft as q8_0), HumanEval prompts 0..{len(prompts) - 1} x {NEW_TOKENS} tokens, greedy. A staged "
        f"forward scores the fed token and up to {args.lookup} looked-up tokens "
        f"(n-grams {options.prompt_lookup_max_ngram} down to {options.lookup_model_min_ngram}) and keeps those "
        "equal to the draft's own choices: the proposals, and so the output and tokens per target call, are the "
        "same; the draft forwards are fewer and some are wider. Modelled draft time: each step's first forward "
        "at the after-verify cost, the others at the after-draft cost (the first forward now feeds one or two "
        "tokens; counted as one).", "",
        "| drafting steps | draft forwards now | staged forwards | staged / now | modelled draft ms now | "
        "modelled draft ms staged |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {len(steps)} | {forwards} | {staged} | {staged / forwards:.3f} | {now_ms:.1f} | {staged_ms:.1f} |", "",
        "| width (tokens) | staged forwards | ms after a verify | ms after a draft forward |",
        "|---:|---:|---:|---:|",
        *[f"| {w} | {count[w]} | {cold[w]:.3f} | {warm[w]:.3f} |" for w in used], ""])
    write_report(f"staged-draft-counts-{args.lookup}.md", text)


if __name__ == "__main__":
    main()

"""A/B of the draft model's GGUF type on the llamacpp backend (--draft-gguf): the same target GGUF and method with
the zoo's draft converted at each type, alternating prompt by prompt in one process, on an idle machine.

What it measures per type: the draft's one-token forward after a 120-token context (median ms), and over the
runs: tokens/s, tokens per target call, draft forwards and the draft's ms per forward (our loop's draft timer
over its forwards: llama.cpp plus the drafter's sampling and confidence test). Every type must give the same text
(the target verifies every draft token); a difference stops the script.

Usage: python scripts/llamacpp_draft_gguf_ab.py [--types q8_0,f32] [--methods model,lookup_model] [--gamma conf]
           [--prompts 8] [--rounds 3]
Writes benchmarks/llamacpp-draft-gguf.md (and prints it)."""
from __future__ import annotations

import statistics
import time

import torch

from draftverify import DraftVerifyError, load
from draftverify.backends import DRAFT_GGUF_TYPES
from draftverify.bench.environment import machine, now
from draftverify.bench.prompts import default_data_dir, load_humaneval
from ab_options import ab_parser, write_report

CONTEXT = 120  # tokens before the timed one-token draft forward, as the bench's cost curve


def one_token_ms(lm, repeats: int = 200) -> float:
    """Median ms of the draft's one-token forward after CONTEXT tokens."""
    lm.start(torch.randint(0, lm.vocab_size, (1, CONTEXT + 1), generator=torch.Generator().manual_seed(0)))
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        lm.forward(torch.tensor([[5]]))
        times.append(time.perf_counter() - started)
        lm.commit(0)
    return 1000 * statistics.median(times)


def draft_lm(pipe):
    """The draft model's backend of `model` (drafter.lm) or `lookup_model` (drafter.model.lm)."""
    drafter = pipe.drafter
    return drafter.lm if hasattr(drafter, "lm") else drafter.model.lm


def measure(pipes: dict[str, object], prompts: list[str], rounds: int) -> dict[str, dict[str, float]]:
    totals = {kind: {"tokens": 0, "seconds": 0.0, "calls": 0, "draft_calls": 0, "draft_seconds": 0.0}
              for kind in pipes}
    texts: dict[int, list[int]] = {}
    for r in range(rounds):
        for i, prompt in enumerate(prompts):
            kinds = list(pipes) if (r + i) % 2 == 0 else list(pipes)[::-1]
            for kind in kinds:
                started = time.perf_counter()
                out = pipes[kind].generate(prompt, max_new_tokens=128).output
                seconds = time.perf_counter() - started
                ids = out.new_tokens[0].tolist()
                if texts.setdefault(i, ids) != ids:
                    raise SystemExit(f"prompt {i}: draft GGUF {kind} gave another text than the first type")
                t, s = totals[kind], out.stats
                t["tokens"] += len(ids)
                t["seconds"] += seconds
                t["calls"] += s.target_calls
                t["draft_calls"] += s.draft_calls
                t["draft_seconds"] += s.time_draft
    return totals


def main() -> None:
    ap = ab_parser()
    ap.add_argument("--types", default="q8_0,f32")
    ap.add_argument("--methods", default="model,lookup_model")
    ap.add_argument("--gamma", default="conf")
    args = ap.parse_args()
    types = args.types.split(",")
    if len(types) < 2 or any(t not in DRAFT_GGUF_TYPES for t in types):
        ap.exit(2, f"error: --types takes two or more of {', '.join(DRAFT_GGUF_TYPES)}, got {args.types!r}\n")
    torch.set_num_threads(2)
    prompts = [p.text for p in load_humaneval(default_data_dir())[: args.prompts]]
    lines = []
    for method in args.methods.split(","):
        try:
            pipes = {t: load(zoo="code", method=method, backend="llamacpp", gamma=args.gamma, threads=2, draft_gguf=t)
                     for t in types}
        except DraftVerifyError as err:
            ap.exit(2, f"error: {err}\n")
        for pipe in pipes.values():
            pipe.generate(prompts[0], max_new_tokens=32)  # warm-up
        forward_ms = {t: one_token_ms(draft_lm(pipe)) for t, pipe in pipes.items()}
        totals = measure(pipes, prompts, args.rounds)
        base = types[1]
        for t in types:
            x = totals[t]
            speed = x["tokens"] / x["seconds"]
            lines.append(f"| `llamacpp:{method}[{args.gamma}]` | {t} | {forward_ms[t]:.3f} | {speed:.1f} | "
                         f"{speed / (totals[base]['tokens'] / totals[base]['seconds']):.2f}x | "
                         f"{x['tokens'] / x['calls']:.2f} | {x['draft_calls']} | "
                         f"{1000 * x['draft_seconds'] / max(x['draft_calls'], 1):.3f} |")
        del pipes
    m = machine()
    text = "\n".join([
        "# The draft model's GGUF type on the llama.cpp backend", "",
        f"`python scripts/llamacpp_draft_gguf_ab.py --types {args.types} "
        f"--methods {args.methods} --gamma {args.gamma} --prompts {args.prompts} --rounds {args.rounds}`; {now()}; "
        f"{m['cpu_model']} ({m['cores']} cores); llama.cpp on 2 threads; the zoo's f32 target GGUF, the zoo's draft "
        f"converted at each type; {args.prompts} HumanEval prompts x 128 tokens, greedy, the types alternating prompt "
        f"by prompt over {args.rounds} rounds in one process. Every type gave the same text on every prompt (the "
        "target verifies each draft token, so the draft's precision changes what is proposed, never the output).", "",
        f"**forward ms**: the draft's one-token forward after {CONTEXT} tokens (median of 200). **vs {types[1]}**: "
        f"tok/s over the {types[1]} draft's. **draft ms / forward**: our loop's draft timer over the draft forwards "
        "(llama.cpp, then sampling and the confidence test).", "",
        f"| row | draft GGUF | forward ms | tok/s | vs {types[1]} | tokens / call | draft forwards | "
        "draft ms / forward |",
        "|---|---|---:|---:|---:|---:|---:|---:|", *lines, ""])
    write_report("llamacpp-draft-gguf.md", text)


if __name__ == "__main__":
    main()

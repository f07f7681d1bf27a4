"""Where the time of one llama.cpp-backend row goes: the target's prefill, its verify forwards, the draft model's
forwards (prefill included) and the rest (our loop, drafter and verifier in Python), with the verify forwards by
width: how many, how many of their tokens were kept, and what they cost.

Why: it says what any change can still win. The prefill is the same for every row, peers included; a verify
forward costs a fixed part and a part per token; only more kept tokens per forward (a better draft) shrink the
fixed part's share. Timers wrap the backend's calls (backends/llamacpp.py LlamaCppLM); the row is
`model` with the given draft and gamma, greedy, 128 new tokens per prompt. The backend decodes the prompt in the
same llama_decode as its first forward after start(), so the prefill rows hold that forward too (the target's first
verify, the draft's first draft forward), and the verify table leaves it out.

Usage: python scripts/llamacpp_time_split.py [--prompts 8] [--rounds 2] [--draft draft-aligned] [--gamma conf=0.9]
Writes benchmarks/llamacpp-time-split.md (and prints it)."""
from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

import torch

from draftverify import DraftVerifyError, load
from draftverify.backends import llamacpp
from draftverify.bench.environment import machine, now
from draftverify.bench.prompts import default_data_dir, load_humaneval
from ab_options import ab_parser, write_report

ROOT = Path(__file__).resolve().parents[1]
WIDTHS = ((1, 1), (2, 2), (3, 4), (5, 8), (9, 16), (17, 32), (33, 64))  # verify width buckets (tokens per forward)


class Timers:
    """Seconds and calls per (role, method) of LlamaCppLM, and each target verify's (width, kept, seconds)."""

    def __init__(self):
        self.seconds: dict[tuple[str, str], float] = defaultdict(float)
        self.calls: dict[tuple[str, str], int] = defaultdict(int)
        self.verifies: list[list] = []  # [width, kept, seconds]
        for name in ("start", "forward", "commit", "rollback"):
            self._wrap(name)

    def _wrap(self, name: str) -> None:
        inner = getattr(llamacpp.LlamaCppLM, name)
        timers = self

        def timed(lm, *args, **kwargs):
            # the backend decodes the prompt with its first forward after start(): that forward is the prefill's
            part = "start" if name == "forward" and lm.deferred else name
            started = time.perf_counter()
            out = inner(lm, *args, **kwargs)
            seconds = time.perf_counter() - started
            timers.seconds[lm.role, part] += seconds
            timers.calls[lm.role, part] += 1 if part == name else 0
            if lm.role == "target" and part == "forward":
                timers.verifies.append([args[0].shape[1], None, seconds])
            if lm.role == "target" and name == "commit" and timers.verifies and timers.verifies[-1][1] is None:
                kept = args[0]
                timers.verifies[-1][1] = int(kept.sum()) if torch.is_tensor(kept) else int(kept)
            return out

        setattr(llamacpp.LlamaCppLM, name, timed)

    def clear(self) -> None:
        self.seconds.clear()
        self.calls.clear()
        self.verifies.clear()


def main() -> None:
    ap = ab_parser(rounds=2)
    ap.add_argument("--draft", default="draft-aligned", help="a draft folder of zoo/code")
    ap.add_argument("--gamma", default="conf=0.9")
    args = ap.parse_args()
    torch.set_num_threads(2)
    timers = Timers()
    try:
        pipe = load(zoo="code", draft=ROOT / "zoo" / "code" / args.draft, method="model", backend="llamacpp",
                    gamma=args.gamma, threads=2)
    except DraftVerifyError as err:
        ap.exit(2, f"error: {err}\n")
    prompts = [p.text for p in load_humaneval(default_data_dir())[: args.prompts]]
    pipe.generate(prompts[0], max_new_tokens=32)  # warm-up
    timers.clear()
    total, new = 0.0, 0
    for _ in range(args.rounds):
        for text in prompts:
            started = time.perf_counter()
            new += pipe.generate(text, max_new_tokens=128).output.stats.new_tokens
            total += time.perf_counter() - started
    s = timers.seconds
    parts = [("target prefill, with its first verify forward", s["target", "start"], timers.calls["target", "start"]),
             ("target verify forwards", s["target", "forward"], timers.calls["target", "forward"]),
             ("draft forwards and prefill", s["draft", "forward"] + s["draft", "start"],
              timers.calls["draft", "forward"] + timers.calls["draft", "start"]),
             ("commits and rollbacks (both)", sum(v for (_, n), v in s.items() if n in ("commit", "rollback")),
              sum(v for (_, n), v in timers.calls.items() if n in ("commit", "rollback")))]
    parts.append(("the rest (loop, drafter, verifier)", total - sum(p[1] for p in parts), None))
    rows = [f"| {name} | {sec:.3f} | {100 * sec / total:.1f}% | {calls if calls is not None else '-'} | "
            f"{1000 * sec / calls:.2f} |" if calls else f"| {name} | {sec:.3f} | {100 * sec / total:.1f}% | - | - |"
            for name, sec, calls in parts]
    buckets = []
    for lo, hi in WIDTHS:
        chosen = [v for v in timers.verifies if lo <= v[0] <= hi]
        if chosen:
            sec = sum(v[2] for v in chosen)
            kept = sum(v[1] or 0 for v in chosen)
            buckets.append(f"| {lo}-{hi} | {len(chosen)} | {sum(v[0] for v in chosen) / len(chosen):.1f} | "
                           f"{kept / len(chosen):.2f} | {1000 * sec / len(chosen):.2f} | {sec:.3f} | "
                           f"{1000 * sec / max(kept, 1):.2f} |")
    m = machine()
    text = "\n".join([
        "# Where a llama.cpp row's time goes", "",
        f"`python scripts/llamacpp_time_split.py --prompts {args.prompts} --rounds {args.rounds} --draft {args.draft} "
        f"--gamma {args.gamma}`; {now()}; {m['cpu_model']} ({m['cores']} cores), 2 threads; `model` on the zoo target "
        f"(f32 GGUF) with `{args.draft}` (q8_0 GGUF), HumanEval prompts 0..{len(prompts) - 1} x 128 tokens, greedy, "
        f"{args.rounds} rounds after a warm-up: {new} new tokens in {total:.3f} s ({new / total:.1f} tok/s). "
        "Timers around the backend's calls; the rest is the wall time outside them. The backend decodes the prompt "
        "in the same llama_decode as its first forward, so the prefill rows hold the target's first verify forward "
        "and the draft's first draft forward, and the width table leaves that verify out.", "",
        "| part | seconds | share | calls | ms / call |", "|---|---:|---:|---:|---:|", *rows, "",
        "## Verify forwards by width", "",
        "Target verify forwards by width (tokens scored; kept: tokens committed, the target's own included):", "",
        "| width | forwards | mean width | mean kept | ms / forward | seconds | ms / kept token |",
        "|---|---:|---:|---:|---:|---:|---:|", *buckets, ""])
    write_report("llamacpp-time-split.md", text)


if __name__ == "__main__":
    main()

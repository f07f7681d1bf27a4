"""A/B of the loop's torch threads on the llama.cpp backend (threads.py): the loop's own tensor ops on one torch
thread (what generate does when no model computes in torch) against torch's setting (2 threads), alternating
in one process, on an idle machine and with one busy process on another core (a server's neighbour, a build).

Usage: python scripts/loop_threads_ab.py [--method model] [--gamma conf] [--prompts 8] [--rounds 3]
Writes benchmarks/loop-threads.md (and prints it)."""
from __future__ import annotations

import contextlib
import subprocess
import sys
import time

import torch

import draftverify.threads as threads
from draftverify import DraftVerifyError, load
from draftverify.bench.environment import machine, now
from draftverify.bench.prompts import default_data_dir, load_humaneval
from ab_options import ab_parser, write_report



@contextlib.contextmanager
def torch_setting(n):
    yield  # leave torch's threads as they are


def measure(pipe, prompts, rounds: int) -> dict[str, float]:
    totals = {"one torch thread": [0, 0.0], "torch's 2 threads": [0, 0.0]}
    policies = {"one torch thread": threads.torch_threads, "torch's 2 threads": torch_setting}
    texts: dict[int, list[int]] = {}
    try:
        for r in range(rounds):
            order = list(policies) if r % 2 == 0 else list(policies)[::-1]
            for mode in order:
                threads.torch_threads = policies[mode]
                for i, prompt in enumerate(prompts):
                    started = time.perf_counter()
                    ids = pipe.generate(prompt, max_new_tokens=128).output.new_tokens[0].tolist()
                    totals[mode][1] += time.perf_counter() - started
                    totals[mode][0] += len(ids)
                    if texts.setdefault(i, ids) != ids:
                        raise SystemExit(f"prompt {i}: the two settings gave different text")
    finally:
        threads.torch_threads = policies["one torch thread"]
    return {mode: n / s for mode, (n, s) in totals.items()}


def main() -> None:
    ap = ab_parser()
    ap.add_argument("--method", default="model")
    ap.add_argument("--gamma", default="conf")
    args = ap.parse_args()
    if args.prompts < 1 or args.rounds < 1:
        ap.error("--prompts and --rounds must be at least 1")
    torch.set_num_threads(2)
    prompts = [p.text for p in load_humaneval(default_data_dir())[: args.prompts]]
    try:
        pipe = load(zoo="code", method=args.method, backend="llamacpp", gamma=args.gamma, threads=2)
    except DraftVerifyError as err:
        ap.exit(2, f"error: {err}\n")
    pipe.generate(prompts[0], max_new_tokens=32)
    rows = []
    for condition in ("idle", "one busy process beside it"):
        busy = None
        if condition != "idle":
            busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            speeds = measure(pipe, prompts, args.rounds)
        finally:
            if busy is not None:
                busy.kill()
        one, two = speeds["one torch thread"], speeds["torch's 2 threads"]
        rows.append(f"| {condition} | {one:.1f} | {two:.1f} | {one / two:.2f}x |")
    m = machine()
    text = "\n".join([
        "# The loop's torch threads on the llama.cpp backend", "",
        f"`python scripts/loop_threads_ab.py --method {args.method} --gamma {args.gamma} --prompts {args.prompts} "
        f"--rounds {args.rounds}`; {now()}; {m['cpu_model']} ({m['cores']} cores); llama.cpp on 2 threads; "
        f"`llamacpp:{args.method}[{args.gamma}]`, {args.prompts} HumanEval prompts x 128 tokens, greedy, the two settings "
        f"alternating {args.rounds} rounds in one process (same text every time).", "",
        "| machine | one torch thread tok/s | torch's 2 threads tok/s | one / two |",
        "|---|---:|---:|---:|", *rows, ""])
    write_report("loop-threads.md", text)


if __name__ == "__main__":
    main()

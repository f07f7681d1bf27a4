"""What a user sees from one `draftverify generate` in a fresh process (cold caches, first call of every shape):
tokens/s per method and draft-length policy, as a ratio to `--method autoregressive` in the same conditions.
Writes benchmarks/cold-start.{json,md}.

Every run is a new process running the installed CLI exactly as the README's main command does (--json for
the statistics); runs of different configurations are interleaved so a drift in machine load hits them alike.
Run it on an otherwise idle machine: the numbers are timings.

Usage: python scripts/cold_start.py [--runs 5] [--new-tokens 128] [--threads 2] [--out benchmarks]
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["def quicksort(xs):", "class LRUCache:\n    def __init__(self, capacity):"]
# (label, extra CLI arguments); the first is the baseline every ratio is taken against
CONFIGS = [
    ("autoregressive", ["--method", "autoregressive"]),
    ("default (zoo)", []),
    ("model, gamma 4", ["--method", "model", "--gamma", "4"]),
    ("model, gamma auto", ["--method", "model", "--gamma", "auto"]),
    ("prompt_lookup, gamma 4", ["--method", "prompt_lookup", "--gamma", "4"]),
    ("prompt_lookup, gamma auto", ["--method", "prompt_lookup", "--gamma", "auto"]),
    ("lookup_model, gamma 4", ["--method", "lookup_model", "--gamma", "4"]),
    ("lookup_model, gamma auto", ["--method", "lookup_model", "--gamma", "auto"]),
]


def cli() -> list[str]:
    script = Path(sys.executable).with_name("draftverify")
    return [str(script)] if script.exists() else [sys.executable, "-m", "draftverify.cli"]


def one_run(extra: list[str], prompt: str, new_tokens: int, threads: int) -> dict:
    args = cli() + ["generate", "--zoo", "code", "--prompt", prompt, "-n", str(new_tokens), "--threads", str(threads),
                    "--json", *extra]
    started = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
    stats = json.loads(done.stdout)["stats"]
    return {"tokens_per_second": stats["tokens_per_second"], "new_tokens": stats["new_tokens"],
            "generate_seconds": stats["time_total"], "process_seconds": wall, "mean_gamma": stats["mean_gamma"],
            "tokens_per_call": stats["tokens_per_call"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5, help="fresh processes per configuration and prompt")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks")
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {label: [] for label, _ in CONFIGS}
    for r in range(args.runs):
        for prompt in PROMPTS:
            for label, extra in CONFIGS:
                runs[label].append(one_run(extra, prompt, args.new_tokens, args.threads))
                print(f"run {r + 1}/{args.runs} {label!r}: {runs[label][-1]['tokens_per_second']:.1f} tok/s", flush=True)
    base = statistics.median(x["tokens_per_second"] for x in runs[CONFIGS[0][0]])
    summary = {}
    for label, _ in CONFIGS:
        tps = [x["tokens_per_second"] for x in runs[label]]
        summary[label] = {"median_tokens_per_second": statistics.median(tps), "min": min(tps), "max": max(tps),
                          "ratio_to_autoregressive": statistics.median(tps) / base,
                          "median_process_seconds": statistics.median(x["process_seconds"] for x in runs[label]),
                          "median_tokens_per_call": statistics.median(x["tokens_per_call"] for x in runs[label]),
                          "median_mean_gamma": statistics.median(x["mean_gamma"] for x in runs[label])}
    command = " ".join(["scripts/cold_start.py"] + sys.argv[1:])
    record = {"command": command, "configs": dict(CONFIGS), "prompts": PROMPTS, "runs_per_prompt": args.runs,
              "new_tokens": args.new_tokens, "threads": args.threads, "machine": platform.machine(),
              "processor": platform.processor(), "python": platform.python_version(), "summary": summary, "runs": runs}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cold-start.json").write_text(json.dumps(record, indent=1) + "\n")
    lines = ["# Cold start: one `draftverify generate` per fresh process", "",
             f"`python {command}`: {args.runs} runs x {len(PROMPTS)} prompts per configuration, {args.new_tokens} new "
             f"tokens, greedy, {args.threads} threads, the code zoo. tok/s is the CLI's own figure (generation only, "
             "model loading excluded); the process column includes imports and loading.", "",
             "| configuration | median tok/s | min - max | vs autoregressive | tokens/call | mean gamma | process s |",
             "|---|---|---|---|---|---|---|"]
    for label, s in summary.items():
        lines.append(f"| {label} | {s['median_tokens_per_second']:.1f} | {s['min']:.1f} - {s['max']:.1f} "
                     f"| {s['ratio_to_autoregressive']:.2f}x | {s['median_tokens_per_call']:.2f} "
                     f"| {s['median_mean_gamma']:.1f} | {s['median_process_seconds']:.1f} |")
    (args.out / "cold-start.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

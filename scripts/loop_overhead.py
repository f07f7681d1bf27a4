"""Measure the decoding loop's own share of wall time (everything outside model forwards) per method on a
6-layer target, and write benchmarks/loop_overhead.md. Usage: python scripts/loop_overhead.py [--threads N]

Random weights are enough here: the overhead is a property of the loop, not of what the model says.
"""
import argparse
import platform
import sys
import tempfile
from pathlib import Path

import torch
import transformers

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from random_models import main as write_random_models  # noqa: E402

from draftverify.api import load  # noqa: E402

PROMPT = "def quicksort(xs):\n    if len(xs) <= 1:\n        return xs\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        write_random_models(Path(tmp))
        rows = []
        for method in ("autoregressive", "model", "prompt_lookup", "early_exit", "bild", "specdec++"):
            pipe = load(target=Path(tmp) / "target", draft=Path(tmp) / "draft", method=method, early_exit_layers=2)
            pipe.generate(PROMPT, max_new_tokens=8)  # warm-up
            s = pipe.generate(PROMPT, max_new_tokens=args.new_tokens).stats
            rows.append((method, s))
    lines = [
        "# Loop overhead on a 6-layer target",
        "",
        f"`python scripts/loop_overhead.py --threads {args.threads} --new-tokens {args.new_tokens}` on "
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"{args.threads} thread(s). Target: Llama, 6 layers, hidden 512 (random weights); draft: 2 layers, hidden 256.",
        "",
        "| method | new tokens | target calls | draft | target forward | verify rule | other | loop overhead |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for method, s in rows:
        t = s.time_total
        lines.append(
            f"| {method} | {s.new_tokens} | {s.target_calls} | {100 * s.time_draft / t:.1f}% | {100 * s.time_target / t:.1f}% "
            f"| {100 * s.time_verify / t:.2f}% | {100 * s.time_other / t:.2f}% | **{100 * s.loop_overhead_fraction:.2f}%** |"
        )
    lines += ["", "Loop overhead = (verify rule + other) / total wall time: the time not spent in model forwards "
              "(drafter forwards are under 'draft', prefill is counted in the total)."]
    out = ROOT / "benchmarks" / "loop_overhead.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

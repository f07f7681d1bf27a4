"""Why verifying a few tokens costs so much more than one on this CPU: the time of the target's LM-head-sized linear
(8192 x 576, float32) on m = 1..16 rows, as nn.functional.linear computes it (x @ W.T) and as W @ x.T (the same
numbers, another BLAS layout), interleaved. On the AMD EPYC this project is measured on, MKL takes its matrix-vector
path for one row and a far slower one for 2-8 rows; W @ x.T stays near the one-row time. A verify pass of n tokens
runs every linear of the model at m = n, so this was the shape of the cost curve; the engine now runs eager
float32 linears on 2-16 rows as W @ x.T (src/draftverify/few_row_linear.py), and the cost curve's
`eager-float32-gemm` mode shows the stock layout beside it (benchmarks/cost-code.md).

Usage: python scripts/skinny_linear.py [--threads 2] [--repeats 50]
"""
import argparse
import statistics
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--rows", default="1,2,3,4,5,8,16")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    weight = torch.randn(8192, 576, generator=torch.Generator().manual_seed(0))  # [out, in], like the LM head
    print(f"torch {torch.__version__}, {args.threads} threads, weight {tuple(weight.shape)} float32; median ms")
    print("| rows m | F.linear (x @ W.T) | W @ x.T | F.linear / W @ x.T |")
    print("|---|---|---|---|")
    with torch.no_grad():
        for m in (int(r) for r in args.rows.split(",")):
            x = torch.randn(m, 576)
            ways = {"linear": lambda: torch.nn.functional.linear(x, weight), "transposed": lambda: (weight @ x.t()).t()}
            times = {name: [] for name in ways}
            for _ in range(3):
                for fn in ways.values():
                    fn()
            for _ in range(args.repeats):
                for name, fn in ways.items():
                    started = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - started)
            lin, tr = (1000 * statistics.median(times[k]) for k in ("linear", "transposed"))
            print(f"| {m} | {lin:.2f} | {tr:.2f} | {lin / tr:.1f}x |")


if __name__ == "__main__":
    main()

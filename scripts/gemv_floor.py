"""Where a one-token forward of the zoo target spends its time on this CPU, next to llama.cpp's time per token.

Per precision (float32, bfloat16), interleaved round by round so a drift in machine load hits every column alike:
- **linears only**, eager and compiled (freezing, as below): the model's nn.Linear layers applied to one token
  each, nothing else: the floor the matrix-vector kernels PyTorch picks set for a forward of this model;
- **eager** and **compiled** (torch.compile with inductor freezing): the whole one-token forward after a 120-token
  context, HF StaticCache (bench/cost.py's StaticForward);
- **llama.cpp**: one token evaluated after the same context, the model converted to GGUF at the same precision
  (needs llama-cpp-python and $DRAFTVERIFY_LLAMA_CPP, see scripts/fetch_llama_cpp_converter.sh).
Writes benchmarks/gemv-floor.{json,md}. Run it on an otherwise idle machine: the numbers are timings.

Usage: python scripts/gemv_floor.py [--threads 2] [--rounds 40] [--out benchmarks]
"""
import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from draftverify.api import zoo_paths
from draftverify.bench import environment
from draftverify.bench.cost import StaticForward, compile_settings, model_for

CONTEXT = 120
GGUF = {"float32": "f32", "bfloat16": "bf16"}


class Linears(torch.nn.Module):
    """Every nn.Linear of a model, each applied to one token of its own width: the forward without the rest."""

    def __init__(self, model):
        super().__init__()
        self.layers = torch.nn.ModuleList(m for m in model.modules() if isinstance(m, torch.nn.Linear))

    def forward(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return [layer(x) for layer, x in zip(self.layers, inputs)]


def linears_only(model, compiled: bool) -> callable:
    module = Linears(model)
    inputs = [torch.randn(1, m.in_features, dtype=m.weight.dtype) for m in module.layers]
    run = torch.compile(module, fullgraph=True, dynamic=False) if compiled else module
    return lambda: run(inputs)


def forward_step(runner: StaticForward, context: torch.Tensor) -> callable:
    runner.prefill(context)
    token = context[:, :1]
    return lambda: runner.step(token, CONTEXT)


def llama_step(target: Path, dtype: str, threads: int, context: torch.Tensor, folder: Path):
    """llama.cpp evaluating one token after the context, rewinding to the context each call; None if unavailable."""
    try:
        from llama_cpp import Llama

        from draftverify.backends.gguf import convert, llama_cpp_dir
    except ImportError:
        return None
    gguf = convert(target, folder / f"target-{GGUF[dtype]}.gguf", llama_cpp_dir(), GGUF[dtype])
    llm = Llama(model_path=str(gguf), n_ctx=512, n_threads=threads, n_threads_batch=threads, verbose=False)
    ids = context[0].tolist()
    llm.eval(ids)

    def step():
        llm.n_tokens = len(ids)  # rewind: the next eval overwrites the same cache cell
        llm.eval(ids[:1])

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--out", default="benchmarks")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = zoo_paths("code")["target"]
    context = torch.randint(100, 4000, (1, CONTEXT), generator=torch.Generator().manual_seed(0))
    folder = tempfile.TemporaryDirectory(prefix="draftverify-gemv-")
    results = {}
    with torch.no_grad(), compile_settings(graphs=8):
        for dtype in ("float32", "bfloat16"):
            model = model_for(target, dtype)
            columns = {"linears only, eager": linears_only(model, False),
                       "linears only, compiled": linears_only(model, True),
                       "eager forward": forward_step(StaticForward(model, CONTEXT + 8, False), context),
                       "compiled forward": forward_step(StaticForward(model, CONTEXT + 8, True), context)}
            llama = llama_step(target, dtype, args.threads, context, Path(folder.name))
            if llama is not None:
                columns["llama.cpp token"] = llama
            for fn in columns.values():  # warm-up; the first compiled call compiles
                for _ in range(3):
                    fn()
            times = {name: [] for name in columns}
            for _ in range(args.rounds):
                for name, fn in columns.items():
                    started = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - started)
            results[dtype] = {name: 1000 * statistics.median(t) for name, t in times.items()}
            print(dtype, {k: round(v, 2) for k, v in results[dtype].items()}, flush=True)
    weights_mb = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)) * 4 / 1e6
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"date": environment.now(), "machine": environment.machine(), "versions": environment.versions(),
              "threads": args.threads, "rounds": args.rounds, "context": CONTEXT, "linear_weights_mb_fp32": weights_mb,
              "median_ms": results, "command": f"python scripts/gemv_floor.py --threads {args.threads} --rounds {args.rounds}"}
    (out / "gemv-floor.json").write_text(json.dumps(record, indent=1) + "\n")
    names = list(next(iter(results.values())))
    lines = ["# One-token forward of the code zoo target: PyTorch's floor and llama.cpp", "",
             f"`{record['command']}`; {record['date']}; {record['machine']['cpu_model']}, {args.threads} threads; "
             f"median of {args.rounds} interleaved rounds, ms. **linears only** = the model's {weights_mb:.0f} MB "
             "(fp32) of nn.Linear weights applied to one token each, nothing else (eager, or compiled with inductor "
             "freezing like the compiled forward): the time PyTorch's matrix-vector kernels alone need.", "",
             "| precision | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for dtype, row in results.items():
        lines.append(f"| {dtype} | " + " | ".join(f"{row[n]:.2f}" for n in names) + " |")
    (out / "gemv-floor.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'gemv-floor.md'}")


if __name__ == "__main__":
    main()

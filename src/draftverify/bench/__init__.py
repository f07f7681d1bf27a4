"""`draftverify bench <suite>`: the harness a user reruns against peers (commands.py lists the suites). Its main suite,
`bench speed`: our loop against Hugging Face generate / assisted generation / prompt lookup / llama.cpp, same
process, same prompts, same token ids; speed, calls, alpha, Theorem 8 prediction, BiLD quality/latency.

    from draftverify.bench import BenchConfig, run_bench
    result = run_bench(BenchConfig(zoo="code", num_prompts=20))      # writes bench-humaneval.{json,md,png}

Modules: config (options), runner_families (which rows exist), prompts (HumanEval / Spec-Bench, shipped in data/),
models (loading), counting (forward hooks), runners (HF and ours), peers (other libraries' rows), ours (our rows from
the method registry), lineup (all rows of a run), summary (aggregation, Theorem 8), quality (chrF), report (JSON,
markdown), plots (PNG), environment (machine, versions), run (orchestration), folders (where each command writes);
speed_command (the speed suite's flags), cli (what it does with them), commands (the group: one typer function per
suite), and one module per other suite (batch, load_test, serve_llamacpp, overhead, overhead_llamacpp, cold_start,
ab, rounds, replay, samples). The seed papers' reproductions live apart, in draftverify.reproduce.

The names below load on first use, so the command line reads bench.folders without importing torch.
"""

from importlib import import_module

# name -> its module, imported on first use: the CLI reads bench.runner_families and bench.folders without torch
_HOMES = {
    "BenchConfig": ".config",
    "families": ".config",
    "Prompt": ".prompts",
    "load_prompts": ".prompts",
    "run_bench": ".run",
}
__all__ = ["BenchConfig", "Prompt", "families", "load_prompts", "run_bench"]


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(import_module(_HOMES[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""`draftverify bench cold-start`: what a user sees from one `draftverify generate` in a fresh process (cold caches,
the first call of every shape), tokens/s per method and draft length as a ratio to the first configuration's.

Every run is a new process running the installed CLI as the README's main command does (--json for the
statistics); configurations are interleaved run by run, so a drift in machine load hits them alike."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from ..errors import DraftVerifyError
from ..markdown import markdown_table
from .folders import SPEED

PROMPTS = ("def quicksort(xs):", "class LRUCache:\n    def __init__(self, capacity):")
# METHOD[:GAMMA], or `default` (the zoo's own method); the first is the reference every ratio is taken against
DEFAULT_CONFIGS = (
    "autoregressive",
    "default",
    "model:4",
    "model:auto",
    "prompt_lookup:4",
    "prompt_lookup:auto",
    "lookup_model:4",
    "lookup_model:auto",
)


def config_arguments(config: str) -> list[str]:
    """A configuration's `generate` arguments: "model:4" -> --method model --gamma 4; "default" -> none."""
    if config == "default":
        return []
    method, _, gamma = config.partition(":")
    if not method:
        raise DraftVerifyError(f"--configs: {config!r} is not METHOD[:GAMMA] or default")
    return ["--method", method] + (["--gamma", gamma] if gamma else [])


def cli() -> list[str]:
    script = Path(sys.executable).with_name("draftverify")
    return [str(script)] if script.exists() else [sys.executable, "-m", "draftverify.cli"]


def one_run(models: list[str], extra: list[str], prompt: str, new_tokens: int, threads: int) -> dict:
    args = cli() + [
        "generate",
        *models,
        "--prompt",
        prompt,
        "-n",
        str(new_tokens),
        "--threads",
        str(threads),
        "--json",
        *extra,
    ]
    started = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise DraftVerifyError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    stats = json.loads(done.stdout)["stats"]
    return {
        "tokens_per_second": stats["tokens_per_second"],
        "new_tokens": stats["new_tokens"],
        "generate_seconds": stats["time_total"],
        "process_seconds": wall,
        "mean_gamma": stats["mean_gamma"],
        "tokens_per_call": stats["tokens_per_call"],
    }


def render(record: dict) -> str:
    lines = [
        "# Cold start: one `draftverify generate` per fresh process",
        "",
        f"`{record['command']}`: {record['runs_per_prompt']} runs x {len(record['prompts'])} prompts per "
        f"configuration, {record['new_tokens']} new tokens, greedy, {record['threads']} threads, "
        f"{record['target'] or 'the ' + str(record['zoo']) + ' zoo'}. tok/s is the CLI's own figure "
        "(generation only, model loading excluded); the process column includes imports and loading.",
        "",
    ]
    columns = ("configuration", "median tok/s", "min - max", f"vs {record['reference']}", "tokens/call")
    cells = [
        (label, f"{s['median_tokens_per_second']:.1f}", f"{s['min']:.1f} - {s['max']:.1f}")
        + (f"{s['ratio_to_reference']:.2f}x", f"{s['median_tokens_per_call']:.2f}", f"{s['median_mean_gamma']:.1f}")
        + (f"{s['median_process_seconds']:.1f}",)
        for label, s in record["summary"].items()
    ]
    return "\n".join(lines + markdown_table((*columns, "mean gamma", "process s"), cells)) + "\n"


def run_cold_start(
    configs: tuple[str, ...] = DEFAULT_CONFIGS,
    runs: int = 5,
    prompts: int = len(PROMPTS),
    new_tokens: int = 128,
    threads: int = 2,
    zoo: str = "code",
    out: str | Path = SPEED,
    name: str = "cold-start",
    command: str = "",
    echo: Callable[[str], None] = lambda line: None,
    target: str | None = None,
    draft: str | None = None,
) -> dict:
    if runs < 1 or not 1 <= prompts <= len(PROMPTS):
        raise DraftVerifyError(f"--runs must be >= 1 and --prompts 1..{len(PROMPTS)}, got {runs} and {prompts}")
    if len(configs) < 1:
        raise DraftVerifyError("--configs names no configuration")
    arguments = {c: config_arguments(c) for c in configs}
    models = ["--target", str(target)] + (["--draft", str(draft)] if draft else []) if target else ["--zoo", zoo]
    texts = PROMPTS[:prompts]
    measured: dict[str, list[dict]] = {c: [] for c in configs}
    for r in range(runs):
        for prompt in texts:
            for c in configs:
                measured[c].append(one_run(models, arguments[c], prompt, new_tokens, threads))
                echo(f"run {r + 1}/{runs} {c}: {measured[c][-1]['tokens_per_second']:.1f} tok/s")
    base = statistics.median(x["tokens_per_second"] for x in measured[configs[0]])
    summary = {}
    for c in configs:
        tps = [x["tokens_per_second"] for x in measured[c]]
        summary[c] = {
            "median_tokens_per_second": statistics.median(tps),
            "min": min(tps),
            "max": max(tps),
            "ratio_to_reference": statistics.median(tps) / base,
            "median_process_seconds": statistics.median(x["process_seconds"] for x in measured[c]),
            "median_tokens_per_call": statistics.median(x["tokens_per_call"] for x in measured[c]),
            "median_mean_gamma": statistics.median(x["mean_gamma"] for x in measured[c]),
        }
    record = {
        "command": command,
        "zoo": zoo if not target else None,
        "target": target,
        "configs": arguments,
        "reference": configs[0],
        "prompts": list(texts),
        "runs_per_prompt": runs,
        "new_tokens": new_tokens,
        "threads": threads,
        "machine": platform.machine(),
        "processor": platform.processor(),
        "python": platform.python_version(),
        "summary": summary,
        "runs": measured,
    }
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")
    (folder / f"{name}.md").write_text(render(record))
    record["files"] = {"json": str(folder / f"{name}.json"), "markdown": str(folder / f"{name}.md")}
    return record

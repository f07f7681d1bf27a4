"""`draftverify bench replay`: a replayed repetitive workload, the traffic a cross-request cache is for. The same
prompt set runs several times (passes) in one process, each method on its own pipeline, so the `suffix` drafter's
cache holds the earlier passes' prompts and answers while prompt lookup sees the current prompt only.

    draftverify bench replay --zoo code --num-prompts 8 --max-new-tokens 128 --passes 2 --threads 2

Greedy. Before the first pass each pipeline decodes a short warm-up text and then forgets it (Drafter.forget), so
the first pass starts cold. Within a pass, prompt-major: each prompt through every method, the method order rotated
per prompt. Every method must give the first method's tokens on every prompt of every pass (all are lossless); a
difference is reported in the file and fails the command. Writes <out>/<name>.json (every generation) and
<name>.md (a row per method and pass: tokens per target call and tokens per second)."""

from __future__ import annotations

from pathlib import Path
from time import perf_counter
from typing import TYPE_CHECKING

from ..errors import DraftVerifyError
from ..markdown import command_block, markdown_table
from . import environment
from .folders import METHODS
from .prompts import load_prompts, prompt_set_name
from .report import write_result

if TYPE_CHECKING:
    from .config import ModelChoice

DEFAULT_METHODS = ("autoregressive", "prompt_lookup", "suffix")
PAIR = ("suffix", "prompt_lookup")  # the comparison the replay is for, when both run
WARMUP_TEXT = "def warm_up(x):"
WARMUP_TOKENS = 8


def _check(methods: tuple[str, ...], num_prompts: int, max_new_tokens: int, passes: int) -> None:
    from ..methods import resolve_method

    if num_prompts < 1 or max_new_tokens < 1 or passes < 1:
        raise DraftVerifyError("--num-prompts, --max-new-tokens and --passes must be >= 1")
    if not methods or len(set(methods)) != len(methods):
        raise DraftVerifyError(f"--methods takes a comma list of distinct methods, got {','.join(methods)!r}")
    for method in methods:
        resolve_method(method)  # a typo fails before any model is loaded


def _record(method: str, pass_: int, index: int, prompt_id: str, result, seconds: float) -> dict:
    stats = result.stats
    return {
        "method": method,
        "pass": pass_,
        "prompt_index": index,
        "prompt_id": prompt_id,
        "new_tokens": stats.new_tokens,
        "target_calls": stats.target_calls,
        "drafted": stats.drafted_tokens,
        "accepted": stats.accepted_tokens,
        "seconds": seconds,
        "new_ids": result.output.new_tokens[0].tolist(),
    }


def summarize(records: list[dict], methods: tuple[str, ...], passes: int) -> list[dict]:
    """One row per (pass, method): totals over the prompts, tokens per target call and per second."""
    rows = []
    for pass_ in range(1, passes + 1):
        for method in methods:
            mine = [r for r in records if r["method"] == method and r["pass"] == pass_]
            tokens = sum(r["new_tokens"] for r in mine)
            calls = sum(r["target_calls"] for r in mine)
            seconds = sum(r["seconds"] for r in mine)
            drafted = sum(r["drafted"] for r in mine)
            rows.append(
                {
                    "method": method,
                    "pass": pass_,
                    "prompts": len(mine),
                    "new_tokens": tokens,
                    "target_calls": calls,
                    "drafted": drafted,
                    "accepted": sum(r["accepted"] for r in mine),
                    "seconds": seconds,
                    "tokens_per_call": tokens / calls if calls else 0.0,
                    "tokens_per_second": tokens / seconds if seconds > 0 else 0.0,
                }
            )
    return rows


def pair_ratios(rows: list[dict]) -> list[dict]:
    """Per pass, suffix over prompt_lookup in tokens per call and tokens per second (none unless both ran)."""
    by = {(r["method"], r["pass"]): r for r in rows}
    out = []
    for pass_ in sorted({r["pass"] for r in rows}):
        ours, peer = by.get((PAIR[0], pass_)), by.get((PAIR[1], pass_))
        if ours is None or peer is None or not peer["tokens_per_call"] or not peer["tokens_per_second"]:
            continue
        out.append(
            {
                "pass": pass_,
                "tokens_per_call": ours["tokens_per_call"] / peer["tokens_per_call"],
                "tokens_per_second": ours["tokens_per_second"] / peer["tokens_per_second"],
            }
        )
    return out


def differences(records: list[dict], reference: str) -> list[str]:
    """Generations whose tokens differ from the reference method's first pass on the same prompt."""
    first = {r["prompt_index"]: r["new_ids"] for r in records if r["method"] == reference and r["pass"] == 1}
    return [
        f"{r['method']} pass {r['pass']} prompt {r['prompt_id']}"
        for r in records
        if r["new_ids"] != first[r["prompt_index"]]
    ]


def run_replay(
    choice: ModelChoice | None = None,
    methods: tuple[str, ...] = DEFAULT_METHODS,
    prompts: str = "humaneval",
    num_prompts: int = 8,
    max_new_tokens: int = 128,
    passes: int = 2,
    gamma: int | str = 8,
    backend: str = "hf",
    threads: int | None = None,
    out: str | Path = METHODS,
    name: str | None = None,
    command: str | None = None,
    echo=None,
) -> dict:
    """Run the replay (see the module) on the target `choice` names (the code zoo's by default; no draft model)
    and write <out>/<name>.json and .md; returns the result dict."""
    import torch

    from ..api import load
    from .config import ModelChoice

    choice = choice or ModelChoice()
    models = choice.load_args()
    _check(methods, num_prompts, max_new_tokens, passes)
    if models["zoo"] is None and models["target"] is None:
        raise DraftVerifyError("no model: give --zoo NAME or --target PATH")
    if threads is not None:
        torch.set_num_threads(threads)
    name = name or f"replay-{prompt_set_name(prompts)}"
    pipes = {m: load(**models, method=m, gamma=gamma, backend=backend, threads=threads) for m in methods}
    first = pipes[methods[0]]
    if first.target.is_encoder_decoder:
        raise DraftVerifyError("bench replay continues prompts: it needs a decoder-only target")
    limit = first.target.max_positions
    chosen = []
    for prompt in load_prompts(prompts, choice.data_dir):
        if len(chosen) == num_prompts:
            break
        length = first.encode(prompt.text).shape[1]
        if length and (limit is None or length + max_new_tokens <= limit):
            chosen.append(prompt)
    if not chosen:
        raise DraftVerifyError(f"no prompt of {prompts!r} fits the context with {max_new_tokens} new tokens")
    for pipe in pipes.values():
        pipe.generate(WARMUP_TEXT, max_new_tokens=WARMUP_TOKENS)
        pipe.drafter.forget()  # the first pass starts cold
    records = []
    for pass_ in range(1, passes + 1):
        for index, prompt in enumerate(chosen):
            shift = index % len(methods)
            for method in methods[shift:] + methods[:shift]:
                if echo is not None:
                    echo(f"pass {pass_}/{passes} prompt {index + 1}/{len(chosen)} ({prompt.id}): {method}")
                started = perf_counter()
                result = pipes[method].generate(prompt.text, max_new_tokens=max_new_tokens)
                records.append(_record(method, pass_, index, prompt.id, result, perf_counter() - started))
    order = {m: i for i, m in enumerate(methods)}
    records.sort(key=lambda r: (r["pass"], r["prompt_index"], order[r["method"]]))
    result = {
        **environment.header(name, command),
        "config": {
            "zoo": models["zoo"],
            "target": str(choice.target) if choice.target else None,
            "methods": list(methods),
            "prompts": prompts,
            "num_prompts": len(chosen),
            "max_new_tokens": max_new_tokens,
            "passes": passes,
            "gamma": gamma,
            "backend": backend,
            "threads": threads if threads is not None else torch.get_num_threads(),
        },
        "prompt_ids": [p.id for p in chosen],
        "rows": (rows := summarize(records, methods, passes)),
        "ratios": pair_ratios(rows),
        "differences": differences(records, methods[0]),
        "records": records,
    }
    return write_result(result, out, name, render_markdown)


def table(rows: list[dict]) -> str:
    """The markdown table: a row per pass and method."""
    columns = (
        "pass",
        "method",
        "new tokens",
        "target calls",
        "tokens / call",
        "drafted",
        "accepted",
        "seconds",
        "tok/s",
    )
    cells = [
        (r["pass"], f"`{r['method']}`", r["new_tokens"], r["target_calls"], f"{r['tokens_per_call']:.2f}")
        + (r["drafted"], r["accepted"], f"{r['seconds']:.2f}", f"{r['tokens_per_second']:.1f}")
        for r in rows
    ]
    return "\n".join(markdown_table(columns, cells, "rlrrrrrrr"))


def render_markdown(result: dict) -> str:
    cfg, machine, versions = result["config"], result["machine"], result["versions"]
    load_avg = machine.get("load_average") or [0.0]
    same = (
        f"Every method gave `{cfg['methods'][0]}`'s tokens on every prompt of every pass."
        if not result["differences"]
        else f"**Differences from `{cfg['methods'][0]}`'s tokens**: {'; '.join(result['differences'])}."
    )
    return "\n".join(
        [
            f"# Replayed prompts: {cfg['prompts']} x {cfg['passes']} passes",
            "",
            f"{cfg['num_prompts']} prompts ({result['prompt_ids'][0]} ...), {cfg['max_new_tokens']} new tokens, "
            f"greedy, gamma {cfg['gamma']}, {cfg['backend']} backend, the same prompts {cfg['passes']} times in one "
            "process. "
            f"{result['date']}; {machine['cpu_model']} ({machine['usable_cores']} cores, threads {cfg['threads']}, "
            f"load average {load_avg[0]:.1f}); python {versions['python']}, torch {versions['torch']}, draftverify "
            f"{versions['draftverify']}, commit {(versions.get('git_commit') or 'unknown')[:12]}.",
            "",
            *command_block("Reproduce (from the repository root):", result["reproduce"]),
            "",
            "How to read: each method runs on its own pipeline, kept for the whole run, so `suffix`'s cache holds "
            "every earlier generation of the run (pass 1 reads the earlier prompts of pass 1; pass 2 also the same "
            "prompt's pass-1 answer), while `prompt_lookup` copies from the current prompt and answer only. Each "
            "pipeline's warm-up text is forgotten before pass 1. **tokens / call**: new tokens over target calls. "
            "**tok/s**: new tokens over the seconds of the generations (the machine's load is in the line above). "
            + same,
            "",
            table(result["rows"]),
            "",
            *ratio_lines(result["ratios"]),
        ]
    )


def ratio_lines(ratios: list[dict]) -> list[str]:
    if not ratios:
        return []
    cells = [(r["pass"], f"{r['tokens_per_call']:.2f}x", f"{r['tokens_per_second']:.2f}x") for r in ratios]
    return [
        f"`{PAIR[0]}` over `{PAIR[1]}`, per pass:",
        "",
        *markdown_table(("pass", "tokens / call", "tok/s"), cells, "rrr"),
        "",
    ]

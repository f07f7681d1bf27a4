"""Batch throughput: tokens per second at batch sizes B = 1, 2, 4, 8 for Hugging Face generate (batched, left
padding), our loop without drafting (autoregressive) and our drafting methods, on the same prompts.

The prompts are split into consecutive batches of B rows; each runner decodes every batch once (after one
untimed warm-up batch) and the wall time of all of them is summed. Greedy, so every row of ours should equal its
batch-1 text of our autoregressive loop: `equal_rows` counts those that do (in float32 / bf16 a batched GEMM can
round differently from a one-row one and flip a near-tie; the tests use float64 models, where all must).

A method runs at --gamma, or at its own draft length written after it as in `draftverify bench speed`'s row names:
`lookup_model[auto]`, `lookup_model[g=6]`. `mean gamma` is the draft length the policy chose per target step (0 for
the plain steps gamma auto takes when no draft pays), averaged over every step at that B: with gamma auto it shows
where speculation stops paying as the batch grows.

    draftverify bench batch --zoo code --methods 'lookup_model,lookup_model[auto]' --batch-sizes 1,2,4,8
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from time import perf_counter
from typing import NamedTuple

import torch

from ..backends.base import require_modules
from ..backends.hf.greedy import hf_greedy
from ..draft_length import parse_gamma
from ..errors import DraftVerifyError
from ..markdown import markdown_table


@dataclass
class BatchRow:
    runner: str
    batch_size: int
    prompts: int
    new_tokens: int
    seconds: float
    steps: int  # forwards of the target after prefill (ours: loop steps; HF: decoding steps)
    # rows equal to their batch-1 text of our autoregressive loop (None for HF). Exact arithmetic makes that all of
    # them; in float32/bf16 a batched GEMM may round differently from a one-row one and flip a near-tie
    equal_rows: int | None
    mean_gamma: float | None = None  # the length policy's gamma per target step (None: the runner drafts nothing)
    tokens_per_second: float = 0.0
    speedup_vs_hf: float | None = None

    def __post_init__(self) -> None:
        self.tokens_per_second = self.new_tokens / self.seconds if self.seconds > 0 else 0.0


class Runner(NamedTuple):
    name: str  # the table's name: the method as listed ("lookup_model", "lookup_model[auto]")
    method: str
    gamma: int | str


def parse_runner(spec: str, default_gamma: int | str) -> Runner:
    """METHOD (at default_gamma) or METHOD[auto], METHOD[heuristic], METHOD[conf], METHOD[conf=T], METHOD[g=N] (the
    names `draftverify bench speed` gives its rows)."""
    match = re.fullmatch(r"([\w+]+)(?:\[(auto|heuristic|conf(?:=[\d.]+)?|g=\d+)\])?", spec.strip())
    if match is None:
        raise DraftVerifyError(
            f"--methods: {spec!r} is not METHOD, METHOD[auto], METHOD[heuristic], METHOD[conf], "
            "METHOD[conf=T] or METHOD[g=N]"
        )
    method, gamma = match.group(1), match.group(2)
    return Runner(spec.strip(), method, default_gamma if gamma is None else parse_gamma(gamma.removeprefix("g=")))


def _batches(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _hf_generate(pipe, rows: list[list[int]], max_new_tokens: int, gamma) -> tuple[list[list[int]], int, list[int]]:
    """Hugging Face generate on one left-padded batch; each row's tokens up to and including its EOS."""
    model = require_modules(pipe.target, "Hugging Face generate").module()
    eos = pipe.eos_token_id
    eos_set = set([eos] if isinstance(eos, int) else (eos or []))
    pad = pipe.tokenizer.pad_token_id if pipe.tokenizer.pad_token_id is not None else (min(eos_set) if eos_set else 0)
    new, width = hf_greedy(model, rows, pad, eos, max_new_tokens)
    return new, width, []


def _ours(pipe, rows: list[list[int]], max_new_tokens: int, gamma) -> tuple[list[list[int]], int, list[int]]:
    from ..types import SamplingParams

    output, _ = pipe.generate_batch_ids(rows, SamplingParams(), max_new_tokens=max_new_tokens, gamma=gamma)
    new = output.rows if output.rows is not None else [output.new_tokens[0].tolist()]
    return new, output.stats.target_calls, output.stats.chosen_gammas


def run_batch_bench(
    pipes: dict, rows: list[list[int]], batch_sizes: list[int], max_new_tokens: int, progress=None
) -> list[BatchRow]:
    """pipes: runner name -> (Pipeline, gamma) (names starting with "hf_" run Hugging Face generate on that pipe's
    target). Runners of one method share its Pipeline, so gamma auto's timings carry over from batch to batch."""
    results: list[BatchRow] = []
    reference: dict[str, list[list[int]]] = {}  # ours_autoregressive -> its B=1 texts (the reference)
    for name, (pipe, gamma) in pipes.items():
        run = _hf_generate if name.startswith("hf_") else _ours
        drafts = not name.startswith("hf_") and pipe.method.drafter != "none"
        run(pipe, rows[: min(2, len(rows))], min(8, max_new_tokens), gamma)  # warm-up, untimed
        for size in batch_sizes:
            texts: list[list[int]] = []
            seconds = 0.0
            steps = 0
            chosen: list[int] = []
            for chunk in _batches(rows, size):
                t0 = perf_counter()
                new, chunk_steps, chunk_gammas = run(pipe, chunk, max_new_tokens, gamma)
                seconds += perf_counter() - t0
                steps += chunk_steps
                chosen.extend(chunk_gammas)
                texts.extend(new)
            if name == "ours_autoregressive" and size == min(batch_sizes):
                reference[name] = texts
            equal = None
            if not name.startswith("hf_") and "ours_autoregressive" in reference:
                equal = sum(a == b for a, b in zip(texts, reference["ours_autoregressive"]))
            mean_gamma = sum(chosen) / len(chosen) if drafts and chosen else None
            results.append(
                BatchRow(
                    name, size, len(rows), sum(len(t) for t in texts), seconds, steps, equal, mean_gamma=mean_gamma
                )
            )
            if progress is not None:
                progress(results[-1])
    hf = {r.batch_size: r.tokens_per_second for r in results if r.runner.startswith("hf_")}
    for r in results:
        if hf.get(r.batch_size):
            r.speedup_vs_hf = r.tokens_per_second / hf[r.batch_size]
    return results


def markdown(results: list[BatchRow], meta: dict) -> str:
    lines = [
        f"# Batch throughput ({meta.get('prompts')} prompts, {meta.get('max_new_tokens')} new tokens, greedy)",
        "",
        f"Command: `{meta.get('command')}`",
        "",
        f"Machine: {meta.get('machine', {}).get('cpu_model')}, torch threads "
        f"{meta.get('versions', {}).get('torch_threads')}",
        "",
    ]
    columns = ("runner", "B", "new tokens", "seconds", "tokens/s", "vs HF generate at B", "target steps", "mean gamma")
    cells = [
        (r.runner, r.batch_size, r.new_tokens, f"{r.seconds:.2f}", f"{r.tokens_per_second:.1f}")
        + ("" if r.speedup_vs_hf is None else f"{r.speedup_vs_hf:.2f}x", r.steps)
        + (
            "" if r.mean_gamma is None else f"{r.mean_gamma:.2f}",
            "" if r.equal_rows is None else f"{r.equal_rows}/{r.prompts}",
        )
        for r in results
    ]
    return "\n".join(lines + markdown_table((*columns, "rows = batch-1 AR text"), cells, "lrrrrrrrl")) + "\n"


def main(
    zoo: str | None,
    target: str | None,
    draft: str | None,
    methods: list[str],
    batch_sizes: list[int],
    prompts_spec: str,
    num_prompts: int,
    max_new_tokens: int,
    out: Path,
    name: str,
    threads: int | None,
    data_dir: Path | None = None,
    echo=print,
    gamma: int | str = 4,
) -> list[BatchRow]:
    """methods: METHOD (at gamma) or METHOD[auto] / METHOD[heuristic] / METHOD[g=N] (see parse_runner)."""
    from ..api import load
    from ..methods import resolve_method
    from .environment import command_line, machine, now, reproduce_command, versions
    from .prompts import load_prompts

    if not batch_sizes or any(b < 1 for b in batch_sizes):
        raise DraftVerifyError(f"--batch-sizes must be integers >= 1, got {batch_sizes}")
    if num_prompts < max(batch_sizes):
        raise DraftVerifyError(
            f"--num-prompts ({num_prompts}) must be at least the largest batch size ({max(batch_sizes)})"
        )
    gamma = parse_gamma(gamma)
    runners = [parse_runner(spec, gamma) for spec in methods]
    for runner in runners:
        resolve_method(runner.method)
    runners = [r for r in runners if r.method != "autoregressive"]  # the baseline always runs
    names = [r.name for r in runners]
    if len(set(names)) != len(names) or set(names) & {"hf_generate", "ours_autoregressive"}:
        raise DraftVerifyError(f"--methods lists a runner twice (or a baseline, which always runs): {', '.join(names)}")
    if threads is not None:
        torch.set_num_threads(threads)
    pipes: dict = {}
    base = load(target=target, zoo=zoo, method="autoregressive")
    pipes["hf_generate"] = (base, None)
    pipes["ours_autoregressive"] = (base, None)
    loaded = {"autoregressive": base}  # one Pipeline per method, shared by its runners
    for runner in runners:
        if runner.method not in loaded:
            loaded[runner.method] = load(target=target, draft=draft, zoo=zoo, method=runner.method)
        pipes[runner.name] = (loaded[runner.method], runner.gamma)
    limit = base.target.max_positions
    texts = [p.text for p in load_prompts(prompts_spec, data_dir)]
    rows = [
        ids
        for ids in (base.encode(t)[0].tolist() for t in texts)
        if limit is None or len(ids) + max_new_tokens <= limit
    ][:num_prompts]
    if len(rows) < num_prompts:
        raise DraftVerifyError(
            f"only {len(rows)} prompts of {prompts_spec} fit the context with "
            f"{max_new_tokens} new tokens; lower --num-prompts or --max-new-tokens"
        )

    def progress(r: BatchRow) -> None:
        gamma = "" if r.mean_gamma is None else f", mean gamma {r.mean_gamma:.2f}"
        echo(f"{r.runner} B={r.batch_size}: {r.tokens_per_second:.1f} tokens/s ({r.seconds:.2f} s){gamma}")

    results = run_batch_bench(pipes, rows, sorted(batch_sizes), max_new_tokens, progress=progress)
    meta = {
        "command": reproduce_command(command_line()),
        "date": now(),
        "machine": machine(),
        "versions": versions(),
        "prompts": f"{len(rows)} {prompts_spec}",
        "max_new_tokens": max_new_tokens,
        "batch_sizes": batch_sizes,
        "zoo": zoo,
        "target": target,
        "draft": draft,
        "methods": methods,
        "gamma": gamma,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in results]}, indent=1))
    (out / f"{name}.md").write_text(markdown(results, meta))
    return results


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise DraftVerifyError(f"--batch-sizes must be a comma list of integers, got {text!r}") from None
    if not sizes or any(s < 1 for s in sizes) or any(not math.isfinite(s) for s in sizes):
        raise DraftVerifyError(f"--batch-sizes must be integers >= 1, got {text!r}")
    return sizes

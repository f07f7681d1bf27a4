"""run_bench(config) -> dict: load, warm up, measure prompt-major, summarise, write JSON / markdown / PNG."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from time import perf_counter

import torch
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from ..errors import DraftVerifyError
from ..quiet import quiet
from . import environment, plots
from .config import BenchConfig
from .lineup import build_runners
from .models import BenchModels, load_models
from .prompts import Prompt, load_prompts
from .report import render_markdown, write_json
from .runners import Runner, install_hooks
from .summary import equality_failures, summarize

console = Console(stderr=True)


def select_prompts(prompts: list[Prompt], models: BenchModels, config: BenchConfig) -> tuple[list, list[str]]:
    """The first num_prompts prompts that tokenize to >= 1 token and fit the models' context with the new tokens."""
    chosen, notes, limit = [], [], models.context_limit
    skipped = []
    for prompt in prompts:
        if len(chosen) == config.num_prompts:
            break
        ids = models.tokenizer(prompt.text, return_tensors="pt").input_ids.to(models.target.device)  # [1, L]
        if ids.shape[1] == 0 or (limit is not None and ids.shape[1] + config.max_new_tokens > limit):
            skipped.append(f"{prompt.id} ({ids.shape[1]} tokens)")
            continue
        chosen.append((prompt, ids))
    if skipped:
        notes.append(
            f"skipped {len(skipped)} prompt(s) that are empty or do not fit the {limit}-position context "
            f"with {config.max_new_tokens} new tokens: {', '.join(skipped[:10])}{' ...' if len(skipped) > 10 else ''}"
        )
    if not chosen:
        raise DraftVerifyError(
            f"no prompt of {config.prompts!r} fits the models' context of {limit} positions with "
            f"--max-new-tokens {config.max_new_tokens}; lower --max-new-tokens"
        )
    if len(chosen) < config.num_prompts:
        notes.append(f"only {len(chosen)} usable prompt(s) for --num-prompts {config.num_prompts}")
    return chosen, notes


def _record(runner: Runner, temperature: float, index: int, prompt: Prompt, seed: int | None, m, tokenizer) -> dict:
    return {
        "runner": runner.name,
        "family": runner.family,
        "temperature": temperature,
        "prompt_index": index,
        "prompt_id": prompt.id,
        "seed": seed,
        "new_tokens": m.new_tokens,
        "seconds": m.seconds,
        "tokens_per_second": m.new_tokens / m.seconds if m.seconds > 0 else None,
        "target_calls": m.target_calls,
        "draft_calls": m.draft_calls,
        "drafted": m.drafted,
        "accepted": m.accepted,
        "rejections": m.rejections,
        "hook_target_forwards": m.hook_target_forwards,
        "hook_draft_forwards": m.hook_draft_forwards,
        "overshoot": m.overshoot,
        "stats": m.stats,
        "text": tokenizer.decode(m.new_ids, skip_special_tokens=True),
        "new_ids": m.new_ids,
    }


def _progress(enabled: bool) -> Progress:
    """The live bar: on a terminal only (rich draws nothing until the end when stderr is a pipe or a file)."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[runner]}"),
        console=console,
        disable=not (enabled and console.is_terminal),
        transient=False,
    )


def _say(config: BenchConfig, text: str) -> None:
    """A progress line on stderr (with --progress): the phases always, and where stderr is not a terminal (CI logs,
    `2> file`, a pipe) a line per runner and prompt, which the bar shows on a terminal."""
    if config.progress:
        console.print(escape(text), soft_wrap=True, highlight=False)


def _lines(config: BenchConfig) -> bool:
    return config.progress and not console.is_terminal


WARMUP_PASSES = 3  # --compile: at most this many warm-up passes (the last one compiled nothing, or a warning follows)


def compilations() -> int:
    """Frames torch.compile (dynamo) has compiled in this process so far, recompilations and graph-less frames
    included: each is seconds of tracing, so one inside a timed generation spoils its timing."""
    from torch._dynamo.utils import counters

    return int(counters["frames"]["total"])


def summed_tokens(records: list[dict], per: str) -> dict[str, list[float]]:
    """Each runner's [new tokens, its records' `per` field (seconds, target_calls)], each summed over the prompts
    of a measure() call's records: the rates below are ratios of sums, so a long prompt weighs as its tokens do."""
    totals: dict[str, list[float]] = {}
    for rec in records:
        total = totals.setdefault(rec["runner"], [0.0, 0.0])
        total[0] += rec["new_tokens"]
        total[1] += rec[per]
    return totals


def tokens_per_second(records: list[dict]) -> dict[str, float]:
    """Each runner's new tokens over its seconds, summed over the prompts of a measure() call's records."""
    return {name: tokens / seconds for name, (tokens, seconds) in summed_tokens(records, "seconds").items()}


def tokens_per_call(records: list[dict]) -> dict[str, float]:
    """Each runner's new tokens over its target calls, summed over the prompts of a measure() call's records."""
    return {name: tokens / max(1, calls) for name, (tokens, calls) in summed_tokens(records, "target_calls").items()}


def measure(runners: list[Runner], config: BenchConfig, chosen: list, tokenizer) -> list[dict]:
    """One warm-up per (runner, temperature) row, then prompt-major: each prompt through every row.

    The warm-up of a compiled runner (--compile) first compiles each width bucket it will use (runner.prepare),
    so no compilation falls inside a timed generation; its seconds (compilation included) and the compilations
    are recorded on the runner, and so are compilations during its timed generations (they should be none).
    The row order is rotated by one per prompt, so no runner always runs right after the same other runner.
    Sampling rows share the seed of the prompt (config.seed + prompt index).
    """
    rows = [(r, t) for t in config.temperatures for r in runners if not (r.greedy_only and t > 0)]
    records: list[dict] = []
    warm_tokens = min(config.warmup_tokens, config.max_new_tokens)
    if config.compile and warm_tokens == 0:
        warm_tokens = 1  # --compile: the warm-up is where the compilation happens; it cannot be skipped
    with _progress(config.progress) as bar:
        # --compile: warm-up passes until one compiles nothing, because a runner's warm-up can invalidate graphs
        # of a model it shares with earlier runners (the target verifying with hidden states for bpd makes its
        # plain graphs recompile once), which the next pass recompiles outside the timing
        for warm_pass in range(WARMUP_PASSES if config.compile else 1):
            if warm_tokens == 0:
                break
            task = bar.add_task(
                "warm-up" if warm_pass == 0 else f"warm-up pass {warm_pass + 1}", total=len(rows), runner=""
            )
            first = chosen[0][1]
            requests = tuple(sorted({ids.shape[1] + config.max_new_tokens for _, ids in chosen}))
            prepared: set[int] = set()
            pass_start = compilations()
            for number, (runner, t) in enumerate(rows, 1):
                bar.update(task, runner=runner.name)
                before, started = compilations(), perf_counter()
                if id(runner) not in prepared:
                    prepared.add(id(runner))
                    runner.prepare(first, requests)
                runner.run(first, t, config.seed, warm_tokens)
                runner.warmup_seconds = (runner.warmup_seconds or 0.0) + perf_counter() - started
                runner.warmup_compiles += compilations() - before
                bar.advance(task)
                if _lines(config):
                    compiled = compilations() - before
                    _say(
                        config,
                        f"warm-up{f' pass {warm_pass + 1}' if warm_pass else ''} {number}/{len(rows)}: "
                        f"{runner.name} T={t:g} ({perf_counter() - started:.1f} s"
                        f"{f', {compiled} graphs compiled' if compiled else ''})",
                    )
            if compilations() == pass_start:
                break
        task = bar.add_task("prompt x runner", total=len(rows) * len(chosen), runner="")
        done = 0
        for index, (prompt, ids) in enumerate(chosen):
            shift = index % len(rows)
            for runner, t in rows[shift:] + rows[:shift]:
                bar.update(task, runner=f"prompt {index + 1}/{len(chosen)} {runner.name} T={t:g}")
                seed = config.seed + index if t > 0 else None
                before = compilations()
                m = runner.run(ids, t, seed if seed is not None else 0, config.max_new_tokens)
                runner.timed_compiles += compilations() - before
                records.append(_record(runner, t, index, prompt, seed, m, tokenizer))
                bar.advance(task)
                done += 1
                if _lines(config):
                    _say(
                        config,
                        f"[{done}/{len(rows) * len(chosen)}] prompt {index + 1}/{len(chosen)} ({prompt.id}) "
                        f"{runner.name} T={t:g}: {m.new_tokens} tokens in {m.seconds:.2f} s",
                    )
    order = {(r.name, t): i for i, (r, t) in enumerate(rows)}
    records.sort(key=lambda rec: (rec["prompt_index"], order[(rec["runner"], rec["temperature"])]))
    return records


def run_bench(config: BenchConfig | None = None, **overrides) -> dict:
    """Run the benchmark described by config (BenchConfig fields as keyword overrides); return the result dict.

    Writes <out>/<name>.json (everything), <name>.md (tables, how to reproduce) and <name>-*.png.
    Raises DraftVerifyError for bad options, missing data files or models.
    """
    config = replace(config or BenchConfig(), **overrides).resolved()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    command = config.command or environment.command_line()
    prompts = load_prompts(config.prompts, config.data_dir)  # before the models: a missing file fails fast
    started = perf_counter()
    _say(
        config,
        f"bench {config.name}: loading the models ({f'zoo {config.zoo!r}' if config.zoo else config.target}) ...",
    )
    models = load_models(config)
    if getattr(models.target.config, "is_encoder_decoder", False):
        raise DraftVerifyError(
            "draftverify bench speed runs decoder-only targets for now (HF generate's output layout and "
            "the early-exit runner assume one); use `draftverify generate` for encoder-decoder models"
        )
    chosen, prompt_notes = select_prompts(prompts, models, config)
    hooks = install_hooks(models)
    runners: list[Runner] = []
    try:
        with quiet():  # HF logs a notice each time the assistant settings differ from its defaults (on purpose)
            _say(config, f"building the runners (models loaded in {perf_counter() - started:.1f} s) ...")
            runners, runner_notes = build_runners(config, models, hooks)
            count = sum(1 for t in config.temperatures for r in runners if not (r.greedy_only and t > 0))
            _say(
                config,
                f"{len(runners)} runners, {count} (runner, temperature) rows x {len(chosen)} prompts of "
                f"{config.max_new_tokens} tokens (models and runners ready after "
                f"{perf_counter() - started:.1f} s)",
            )
            records = measure(runners, config, chosen, models.tokenizer)
    finally:
        hooks.remove()
        for runner in runners:
            runner.close()  # the llamacpp_native rows' servers
    used = [p for p, _ in chosen]
    rows = summarize(runners, config.temperatures, used, records)

    warnings = [
        f"greedy output of lossless runner `{r['runner']}` equals the baseline on only "
        f"{100 * r['equal_to_baseline']:.0f}% of prompts (must be 100%)"
        for r in equality_failures(rows)
    ]
    warnings += [
        f"`{r.name}` compiled {r.timed_compiles} time(s) during its timed generations (a width its "
        "warm-up did not reach, or a recompilation): its timings include compilation"
        for r in runners
        if r.timed_compiles
    ]
    for warning in warnings:
        console.print(f"[bold red]WARNING: {warning}[/bold red]")

    cost = _cost_curve(config) if len(config.backends) > 1 and not config.quick else None

    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    files = {"json": str(out / f"{config.name}.json"), "markdown": str(out / f"{config.name}.md")}
    result = {
        **environment.header(config.name, command, config.device),
        "config": config.as_dict(),
        "models": models.describe(),
        "prompts": [
            {"index": i, "id": p.id, "prompt_tokens": int(ids.shape[1]), "has_reference": p.reference is not None}
            for i, (p, ids) in enumerate(chosen)
        ],
        "runner_specs": [r.describe() for r in runners],
        "runners": rows,
        "measurements": records,
        "warnings": warnings,
        "notes": config.notes + models.notes + runner_notes + prompt_notes,
        "files": files,
    }
    if cost is not None:
        result["cost_curve"] = cost
    write_json(result, Path(files["json"]))  # the measurements are safe on disk before any plotting
    _say(
        config,
        f"measured in {perf_counter() - started:.1f} s; writing {out / config.name}.md"
        + (" and the plots" if config.plots else ""),
    )
    if config.plots:
        _plot_all(rows, out, config, result)
    write_json(result, Path(files["json"]))
    Path(files["markdown"]).write_text(render_markdown(result))
    return result


COST_SIZES = (1, 2, 3, 4, 5, 6, 8, 12, 16)  # verify widths the bench's methods use


def _cost_curve(config: BenchConfig) -> dict:
    """With several backends, the target's cost of scoring n tokens on each (float32), measured in the same run
    after the runners (cost_run.py), so the speedups and the verify costs that explain them sit in one file."""
    import tempfile

    from .cost_run import CostConfig, run_cost

    _say(config, "measuring the cost curve of every backend ...")
    modes = tuple(("eager" if b == "hf" else b) + "-float32" for b in config.backends)
    with tempfile.TemporaryDirectory() as scratch:  # run_cost writes its own files; the bench keeps its result
        return run_cost(
            CostConfig(
                zoo=config.zoo,
                target=config.target,
                sizes=COST_SIZES,
                modes=modes,
                threads=config.threads,
                equality_prompts=2,
                equality_tokens=16,
                out=scratch,
                name="cost",
                plots=False,
                data_dir=config.data_dir,
            )
        )


def _plot_all(rows: list[dict], out: Path, config: BenchConfig, result: dict) -> None:
    jobs = [
        ("speedup_png", plots.plot_speedup, "speedup"),
        ("tokens_per_call_png", plots.plot_tokens_per_call, "tokens-per-call"),
    ]
    if any(r["family"] == "bild" for r in rows):
        jobs.append(("bild_png", plots.plot_bild, "bild"))
    for key, plot, suffix in jobs:
        try:
            result["files"][key] = str(plot(rows, out / f"{config.name}-{suffix}.png", config.prompts))
        except Exception as err:  # a plot must not cost the measurements: note it and go on
            result["notes"].append(f"plot {suffix} failed: {type(err).__name__}: {err}")
            console.print(f"[yellow]plot {suffix} failed: {err}[/yellow]")

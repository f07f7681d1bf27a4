"""`draftverify bench native`: our best exact row against llama.cpp's best native row, per prompt set and target
file, each side tuned the way a user would tune it on that prompt set.

For each target GGUF type and each prompt set, one cell:
1. **Sweep.** Every row of both sides runs once over the prompts (the bench's measurement, run.py: one warm-up
   generation per row, then prompt-major, the row order rotated per prompt): ours are the given method families at
   the given draft lengths on the llama.cpp backend (`llamacpp:<method>[<gamma>]`), llama.cpp's are its own
   `llama-server` at the `llamacpp_native[...]` settings given (SWEEP_SPECS by default: draft-simple's n_max and
   p_min with both zoo drafts, the n-gram drafters, their chains). Each side's plain decoding runs too.
2. **Rounds.** The `finalists` fastest rows of each side in the sweep (ours among the rows whose greedy text equals
   our plain decoding's on every prompt) and both plain rows run `rounds` more times, every row restarted before
   each round (Runner.new_round: a llama-server forgets its n-gram cache). A row's speed is its median round; each
   side's best row is the finalist with the highest median; the ratio's range is over the rounds.

Both sides keep what a round's earlier prompts taught their drafters, as a server does across requests:
llama-server's n-gram caches live as long as the server, our rows keep the suffix cache until the next round
(OursRunner.forget_each_prompt off); a new round starts both empty.

Exactness is read, not assumed: each of our rows against our plain decoding on the same backend, each native row
against llama.cpp's plain row, and the two plain rows against each other, prompt by prompt in every round. The
result file is written after each cell, and a rerun with the same settings skips the cells already in it, so a
long sweep resumes where it stopped.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ..backends.llamacpp_kernels import LIB_PATH_ENV, library, library_lines
from ..errors import DraftVerifyError
from .folders import SPEED
from .native_spec import FAMILY as NATIVE, SWEEP, native_specs

if TYPE_CHECKING:
    from .config import ModelChoice

# two Spec-Bench categories, one of them not code (summarization's and rag's prompts fill most of the zoo's window,
# so their prefill would take most of a row's time)
DEFAULT_PROMPT_SETS = ("humaneval", "spec_bench:coding", "spec_bench:math_reasoning")
DEFAULT_TARGET_GGUFS = ("f32", "q8_0", "q4_k_m")
# ours: the draft model, the model-free suffix cache, prompt lookup then the draft model (llama.cpp's chains), and
# drafts chosen by what they earn; each one with a draft model also with the aligned draft, as llama.cpp's rows run
# with both zoo drafts
DEFAULT_METHODS = ("model", "model_aligned", "suffix", "lookup_model", "lookup_model_aligned", "earn", "earn_aligned")
DEFAULT_GAMMAS = ("conf", "conf=0.9")
OURS_PLAIN = "llamacpp:ours_autoregressive"
NATIVE_PLAIN = f"{NATIVE}[plain]"


def is_ours(row: str) -> bool:
    return row.startswith("llamacpp:")


def exact_rows(records: list[dict]) -> dict[str, bool]:
    """Row -> whether its greedy text equals its side's plain row's on every prompt of these records (ours against
    OURS_PLAIN, llama.cpp's against NATIVE_PLAIN; each plain row against the other)."""
    texts = {(r["runner"], r["prompt_index"]): r["new_ids"] for r in records}
    rows = sorted({r["runner"] for r in records})
    prompts = sorted({r["prompt_index"] for r in records})

    def baseline(row: str) -> str:
        if row == OURS_PLAIN:
            return NATIVE_PLAIN
        if row == NATIVE_PLAIN:
            return OURS_PLAIN
        return OURS_PLAIN if is_ours(row) else NATIVE_PLAIN

    return {row: all(texts[row, i] == texts[baseline(row), i] for i in prompts) for row in rows}


def pick_finalists(speeds: dict[str, float], exact: dict[str, bool], finalists: int) -> list[str]:
    """The `finalists` fastest speculative rows of each side (ours only among exact rows), fastest first."""

    def fastest(candidates: list[str]) -> list[str]:
        return sorted(candidates, key=lambda row: -speeds[row])[:finalists]

    rows = [row for row in speeds if row not in (OURS_PLAIN, NATIVE_PLAIN)]
    ours = fastest([row for row in rows if is_ours(row) and exact[row]])
    native = fastest([row for row in rows if not is_ours(row)])
    return ours + native


def summarize(per_round: list[dict[str, float]], finalists: list[str]) -> dict:
    """Median tok/s per row over the rounds; each side's best finalist; best-over-best and plain-over-plain ratios
    (median over rounds, with their range)."""
    median = {row: statistics.median(r[row] for r in per_round) for row in per_round[0]}

    def ratio(ours: str | None, peer: str | None) -> dict | None:
        if ours is None or peer is None:
            return None
        ratios = [r[ours] / r[peer] for r in per_round]
        return {"ours": ours, "peer": peer, "ratio": statistics.median(ratios), "low": min(ratios), "high": max(ratios)}

    best_ours = fastest([row for row in finalists if is_ours(row)], median)
    best_native = fastest([row for row in finalists if not is_ours(row)], median)
    return {
        "median_tokens_per_second": median,
        "best": ratio(best_ours, best_native),
        "plain": ratio(OURS_PLAIN, NATIVE_PLAIN),
    }


def duel(rows: list, config, chosen: list, tokenizer, rounds: int, finalists: int, echo: Callable[[str], None]) -> dict:
    """One cell: the sweep over `rows`, then `rounds` rounds of the finalists and both plain rows."""
    from .run import measure, tokens_per_call, tokens_per_second

    for row in rows:
        row.new_round()
    records = measure(rows, config, chosen, tokenizer)
    sweep_speed, sweep_exact, sweep_calls = tokens_per_second(records), exact_rows(records), tokens_per_call(records)
    echo("sweep: " + ", ".join(f"{row} {speed:.1f}" for row, speed in sweep_speed.items()))
    chosen_rows = pick_finalists(sweep_speed, sweep_exact, finalists)
    finalist_rows = [row for row in rows if row.name in (OURS_PLAIN, NATIVE_PLAIN, *chosen_rows)]
    per_round: list[dict[str, float]] = []
    exact = {row.name: True for row in finalist_rows}
    quiet = replace(config, warmup_tokens=0)
    for r in range(rounds):
        for row in finalist_rows:
            row.new_round()
        round_records = measure(finalist_rows, quiet, chosen, tokenizer)
        per_round.append(tokens_per_second(round_records))
        exact = {row: ok and exact_rows(round_records)[row] for row, ok in exact.items()}
        echo(f"round {r + 1}: " + ", ".join(f"{row} {speed:.1f}" for row, speed in per_round[-1].items()))
    return {
        "sweep": [
            {"row": row, "tokens_per_second": speed, "tokens_per_call": sweep_calls[row], "exact": sweep_exact[row]}
            for row, speed in sorted(sweep_speed.items(), key=lambda item: -item[1])
        ],
        "finalists": chosen_rows,
        "rounds": per_round,
        "exact": exact,
        **summarize(per_round, chosen_rows),
    }


def rank(items: tuple[str, ...], item: str) -> int:
    """Where item stands in the command's list (cells kept from an earlier run with other lists go last)."""
    return items.index(item) if item in items else len(items)


@dataclass(frozen=True)
class Sweep:
    """What each cell sweeps on both sides and how long it times them: our methods at each draft length, llama.cpp's
    native rows, the rounds of each side's fastest `finalists`, and the prompts and tokens of each. With the models
    and threads, the settings a rerun must match to keep the cells it finds (the result's "settings")."""

    methods: tuple[str, ...] = DEFAULT_METHODS
    gammas: tuple = DEFAULT_GAMMAS
    native: tuple[str, ...] = (SWEEP,)
    rounds: int = 3
    finalists: int = 2
    num_prompts: int = 8
    max_new_tokens: int = 96


def _settings(**values) -> dict:
    return {key: list(value) if isinstance(value, tuple) else value for key, value in values.items()}


def run_versus(
    prompt_sets: tuple[str, ...] = DEFAULT_PROMPT_SETS,
    target_ggufs: tuple[str, ...] = DEFAULT_TARGET_GGUFS,
    sweep: Sweep = Sweep(),
    choice: ModelChoice | None = None,
    threads: int | None = 2,
    out: str | Path = SPEED,
    name: str = "bench-native",
    command: str = "",
    echo: Callable[[str], None] = lambda line: None,
    fresh: bool = False,
    flash_attn: bool | None = None,
) -> dict:
    """Every (target GGUF type, prompt set) cell of the models `choice` names (the code zoo's by default);
    OUT/NAME.json and OUT/NAME.md written after each one. Cells already in OUT/NAME.json from a run with the same
    settings are kept, not measured again, unless `fresh`: the run then starts from an empty file. `flash_attn`:
    llama.cpp's flash attention on both sides (None: its default, on). The library our rows load (llama-cpp-python's,
    or the one LLAMA_CPP_LIB_PATH names) is part of the settings and named in the file with what its kernels mean
    for exactness."""
    import torch

    from . import environment
    from .config import ModelChoice
    from .lineup import build_runners
    from .models import load_models
    from .prompts import load_prompts
    from .report import write_result
    from .run import select_prompts
    from .runners import OursRunner, install_hooks

    for label, value, low in (("--rounds", sweep.rounds, 1), ("--finalists", sweep.finalists, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise DraftVerifyError(f"{label} must be a whole number >= {low}, got {value!r}")
    if not prompt_sets or not target_ggufs or not sweep.methods:
        raise DraftVerifyError("--prompts, --target-gguf and --methods each need at least one item")
    if not native_specs(sweep.native):
        raise DraftVerifyError(f"--native names no {NATIVE}[...] row, got {','.join(sweep.native)!r}")
    if threads is not None:
        torch.set_num_threads(threads)
    choice = choice or ModelChoice()
    settings = _settings(
        **asdict(sweep), **choice.named(), threads=threads, flash_attn=flash_attn, library=os.environ.get(LIB_PATH_ENV)
    )
    previous = Path(out) / f"{name}.json"
    kept = json.loads(previous.read_text()) if previous.is_file() and not fresh else None
    cells = kept["cells"] if kept and kept.get("settings") == settings else []
    result = {
        "name": name,
        "command": command,
        "date": environment.now(),
        "machine": environment.machine(),
        "settings": settings,
        "cells": cells,
    }
    prompt_lists = {prompts: load_prompts(prompts, choice.data_dir) for prompts in prompt_sets}
    configs = {  # every option checked before the first model loads
        gguf: choice.greedy_config(
            threads,
            sweep.num_prompts,
            sweep.max_new_tokens,
            backends=("llamacpp",),
            runners=(*sweep.methods, *sweep.native, NATIVE_PLAIN),
            gammas=sweep.gammas,
            target_gguf=gguf,
            flash_attn=flash_attn,
        )
        for gguf in target_ggufs
    }
    for gguf, config in configs.items():
        todo = [p for p in prompt_sets if not any(c["target_gguf"] == gguf and c["prompts"] == p for c in cells)]
        if not todo:
            continue
        models = load_models(config)
        hooks = install_hooks(models)
        runners = []
        try:
            runners, notes = build_runners(config, models, hooks)
            for note in notes:  # a method asked for that gets no row, and why
                echo(f"note: {note}")
            rows = [r for r in runners if r.name.startswith("llamacpp:") or r.name.startswith(NATIVE)]
            for row in rows:  # ours keep the suffix cache across a round's prompts, as llama-server its n-grams
                if isinstance(row, OursRunner):
                    row.forget_each_prompt = False
            missing = {OURS_PLAIN, NATIVE_PLAIN} - {r.name for r in rows}
            if missing:
                raise DraftVerifyError(f"no {' or '.join(sorted(missing))} row: " + "; ".join(notes))
            for prompts in todo:
                echo(f"{gguf}, {prompts}:")
                chosen, _ = select_prompts(prompt_lists[prompts], models, replace(config, prompts=prompts))
                cell = duel(rows, config, chosen, models.tokenizer, sweep.rounds, sweep.finalists, echo)
                cells.append({"target_gguf": gguf, "prompts": prompts, "num_prompts": len(chosen), **cell})
                result["llama_cpp_library"] = library(sys.modules["llama_cpp.llama_cpp"])
                cells.sort(key=lambda c: (rank(target_ggufs, c["target_gguf"]), rank(prompt_sets, c["prompts"])))
                result["date"] = environment.now()
                write_result(result, out, name, render)
        finally:
            hooks.remove()
            for runner in runners:
                runner.close()  # the llamacpp_native rows' servers
    return write_result(result, out, name, render)


def _ratio(item: dict | None) -> str:
    return "-" if item is None else f"{item['ratio']:.2f}x ({item['low']:.2f}x - {item['high']:.2f}x)"


def fastest(rows: list[str], median: dict[str, float]) -> str | None:
    """The row with the highest median tok/s (None: no rows)."""
    return max(rows, key=lambda row: median[row], default=None)


def fastest_finalist(cell: dict, ours: bool) -> str | None:
    """A cell's fastest finalist of one side by median round (None: that side had none, e.g. none of our rows was
    exact), so a side's best row is named even when the other side has none to set against it."""
    return fastest([row for row in cell["finalists"] if is_ours(row) == ours], cell["median_tokens_per_second"])


def render(result: dict) -> str:
    from .report import markdown_table

    s = result["settings"]
    lines = [
        "# Ours against llama.cpp's own engine, each side's best row per prompt set",
        "",
        f"`{result['command']}`",
        "",
        f"{result['date']}; {result['machine']['cpu_model']} ({result['machine']['cores']} cores), "
        f"{s['threads']} threads; {s['num_prompts']} prompts x {s['max_new_tokens']} tokens per prompt set, greedy. "
        f"Each side's settings swept once per cell; its {s['finalists']} fastest rows and both plain rows then run "
        f"{s['rounds']} rounds, every row restarted before each; tok/s is the median round, the ratio the median "
        "of per-round ratios (its range over rounds in brackets). Ours are picked among exact rows only.",
        "",
        *library_lines(result.get("llama_cpp_library"), result["settings"].get("flash_attn")),
    ]
    head = [
        "target",
        "prompts",
        "llama.cpp plain tok/s",
        "ours plain / llama.cpp plain",
        "llama.cpp best row",
        "tok/s",
        "ours best row",
        "tok/s",
        "ours best / llama.cpp best",
        "every row exact",
    ]
    body = []
    for c in result["cells"]:
        median = c["median_tokens_per_second"]
        peer, ours = fastest_finalist(c, ours=False), fastest_finalist(c, ours=True)
        body.append(
            [
                c["target_gguf"],
                c["prompts"],
                f"{median[NATIVE_PLAIN]:.1f}",
                _ratio(c["plain"]),
                f"`{peer}`" if peer else "-",
                f"{median[peer]:.1f}" if peer else "-",
                f"`{ours}`" if ours else "none exact",
                f"{median[ours]:.1f}" if ours else "-",
                _ratio(c["best"]),
                "yes" if all(c["exact"].values()) else "no: " + ", ".join(r for r, ok in c["exact"].items() if not ok),
            ]
        )
    lines += markdown_table(head, body)
    for c in result["cells"]:
        lines += ["", f"## {c['target_gguf']}, {c['prompts']} ({c['num_prompts']} prompts): the sweep", ""]
        rows = [
            [
                f"`{r['row']}`",
                f"{r['tokens_per_second']:.1f}",
                f"{r['tokens_per_call']:.2f}",
                "yes" if r["exact"] else "no",
            ]
            for r in c["sweep"]
        ]
        lines += markdown_table(["row", "tok/s (one pass)", "tokens / target call", "= plain"], rows)
    lines.append("")
    return "\n".join(lines)

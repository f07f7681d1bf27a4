"""`draftverify bench rounds`: head-to-head ratios of bench rows over several rounds in one process, so each ratio
comes with its spread (one bench run on a shared machine moves a row by several percent).

The rows are the bench's own runners (lineup.py), built once; each round is the bench's measurement (run.py:
prompt-major, every prompt through every row, the order rotated per prompt; the first round after one warm-up
generation per row). Each round starts as the first (Runner.new_round): a llama-server row is restarted, so its
n-gram cache does not replay the answers of the same prompts from the rounds before. In each pair ours must give
the peer's greedy text on every prompt (both rows run the same target); a difference stops the run."""

from __future__ import annotations

import re
import statistics
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ..errors import DraftVerifyError
from ..markdown import markdown_table
from .folders import SPEED
from .native_spec import is_native

if TYPE_CHECKING:
    from .config import ModelChoice

# ours on llama.cpp against llama.cpp plain and its prompt lookup at llama-cpp-python's defaults, with the zoo draft
# and its aligned twin; `model` with the confidence stop on HF against transformers' assisted generation
DEFAULT_PAIRS = (
    "llamacpp:model[conf]/llamacpp",
    "llamacpp:model[conf]/llamacpp_prompt_lookup[default]",
    "llamacpp:model_aligned[conf=0.9]/llamacpp",
    "llamacpp:model_aligned[conf=0.9]/llamacpp_prompt_lookup[default]",
    "model[conf]/hf_assisted[hf-default]",
)


def parse_pairs(text: str) -> list[tuple[str, str]]:
    """ "OURS/PEER,..." -> [(ours, peer)] (a row name's brackets may hold commas: llamacpp_native[a,b])."""
    from .config import split_top_level

    try:
        items = split_top_level("--pairs", text)
    except DraftVerifyError:
        items = []
    pairs = [tuple(p.split("/")) for p in items]
    if not pairs or any(len(p) != 2 or not all(p) for p in pairs):
        raise DraftVerifyError(f"--pairs takes a comma list of OURS/PEER row names, got {text!r}")
    return pairs  # type: ignore[return-value]


def family(row: str) -> str:
    """The runner family of a row name: llamacpp:model[conf] -> model, hf_assisted[hf-default] -> hf_assisted;
    a llamacpp_native[...] row is its own (--runners names each native row)."""
    if is_native(row):
        return row
    return re.sub(r"\[.*\]$", "", row.split(":", 1)[-1])


def render(result: dict) -> str:
    names, per_round = result["rows"], result["rounds"]
    lines = [
        "# Head to head over rounds",
        "",
        f"`{result['command']}`",
        "",
        f"{result['date']}; {result['machine']['cpu_model']} ({result['machine']['cores']} cores); "
        f"{result['prompts']} prompts x {result['max_new_tokens']} tokens, greedy; {len(per_round)} rounds of "
        "the bench's measurement in one process. In every pair ours gave the peer's greedy text on every "
        "prompt of every round.",
        "",
    ]
    columns = ("ours", "peer", "ours tok/s (median round)", "peer tok/s (median round)", "ours / peer (median round)")
    cells = [
        (f"`{p['ours']}`", f"`{p['peer']}`", f"{p['ours_tokens_per_second']:.1f}")
        + (f"{p['peer_tokens_per_second']:.1f}", f"{p['ratio']:.2f}x", f"{p['low']:.2f}x - {p['high']:.2f}x")
        for p in result["pairs"]
    ]
    lines += markdown_table((*columns, "range over rounds"), cells, "llrrrl")
    each_round = [(r + 1, *(f"{x[n]:.1f}" for n in names)) for r, x in enumerate(per_round)]
    lines += ["", "## Rounds (tok/s)", ""]
    lines += markdown_table(("round", *(f"`{n}`" for n in names)), each_round, "l" + "r" * len(names))
    return "\n".join(lines + [""])


def run_rounds(
    pairs: list[tuple[str, str]],
    rounds: int = 5,
    num_prompts: int = 8,
    max_new_tokens: int = 128,
    gammas: tuple = ("conf", "conf=0.9"),
    backends: tuple[str, ...] = ("hf", "llamacpp"),
    choice: ModelChoice | None = None,
    threads: int | None = 2,
    out: str | Path = SPEED,
    name: str = "bench-rounds",
    command: str = "",
    echo: Callable[[str], None] = lambda line: None,
) -> dict:
    """Measure every row the pairs name `rounds` times (the models `choice` names: the code zoo's by default);
    write OUT/NAME.json and OUT/NAME.md."""
    import torch

    from . import environment
    from .config import ModelChoice
    from .lineup import build_runners
    from .models import load_models
    from .prompts import load_prompts
    from .report import write_result
    from .run import measure, select_prompts, tokens_per_second
    from .runners import install_hooks

    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise DraftVerifyError(f"--rounds must be a whole number >= 1, got {rounds!r}")
    if threads is not None:
        torch.set_num_threads(threads)
    wanted = {n for pair in pairs for n in pair}
    families = tuple(sorted({family(n) for n in wanted}))
    config = (choice or ModelChoice()).greedy_config(
        threads, num_prompts, max_new_tokens, backends=backends, runners=families, gammas=gammas
    )
    models = load_models(config)
    hooks = install_hooks(models)
    runners = []
    try:
        runners, _ = build_runners(config, models, hooks)
        chosen, _ = select_prompts(load_prompts(config.prompts, config.data_dir), models, config)
        missing = wanted - {r.name for r in runners}
        if missing:
            raise DraftVerifyError(
                f"no bench row named {', '.join(sorted(missing))} (rows: {', '.join(r.name for r in runners)})"
            )
        rows = [r for r in runners if r.name in wanted]
        per_round = []
        for r in range(rounds):
            for row in rows if r else ():
                row.new_round()
            records = measure(rows, config if r == 0 else replace(config, warmup_tokens=0), chosen, models.tokenizer)
            texts = {(rec["runner"], rec["prompt_index"]): rec["new_ids"] for rec in records}
            for ours, peer in pairs:
                for i in range(len(chosen)):
                    if texts[ours, i] != texts[peer, i]:
                        raise DraftVerifyError(
                            f"round {r + 1}, prompt {i}: {ours} and {peer} gave different greedy text"
                        )
            per_round.append(tokens_per_second(records))
            echo(f"round {r + 1}: " + ", ".join(f"{n} {v:.1f}" for n, v in per_round[-1].items()))
    finally:
        hooks.remove()
        for runner in runners:
            runner.close()  # the llamacpp_native rows' servers
    summary = []
    for ours, peer in pairs:
        ratios = [x[ours] / x[peer] for x in per_round]
        summary.append(
            {
                "ours": ours,
                "peer": peer,
                "ours_tokens_per_second": statistics.median(x[ours] for x in per_round),
                "peer_tokens_per_second": statistics.median(x[peer] for x in per_round),
                "ratio": statistics.median(ratios),
                "low": min(ratios),
                "high": max(ratios),
            }
        )
    result = {
        **environment.header(name, command),
        "prompts": len(chosen),
        "max_new_tokens": config.max_new_tokens,
        "rows": [r.name for r in rows],
        "pairs": summary,
        "rounds": per_round,
    }
    return write_result(result, out, name, render)

"""`draftverify bench overhead`: the decoding loop's own share of wall time per method (everything outside model
forwards: the verify rule and the loop's bookkeeping), from each generation's own timers."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import DraftVerifyError
from ..markdown import markdown_table
from .folders import COST

if TYPE_CHECKING:
    from .config import ModelChoice

PROMPT = "def quicksort(xs):\n    if len(xs) <= 1:\n        return xs\n"
DEFAULT_METHODS = ("autoregressive", "model", "prompt_lookup", "early_exit", "bild", "specdec++")


def render(result: dict) -> str:
    lines = [
        "# Loop overhead",
        "",
        f"`{result['command']}`",
        "",
        f"{result['date']}; {result['machine']['cpu_model']} ({result['machine']['cores']} cores), "
        f"{result['threads'] or 'torch default'} thread(s); {result['models']}; {result['new_tokens']} new tokens "
        "after one 8-token warm-up, greedy.",
        "",
    ]
    columns = (
        "method",
        "new tokens",
        "target calls",
        "draft",
        "target forward",
        "verify rule",
        "other",
        "loop overhead",
    )
    cells = [
        (r["method"], r["new_tokens"], r["target_calls"], f"{r['draft']:.1f}%", f"{r['target']:.1f}%")
        + (f"{r['verify']:.2f}%", f"{r['other']:.2f}%", f"**{r['overhead']:.2f}%**")
        for r in result["rows"]
    ]
    lines += markdown_table(columns, cells)
    lines += [
        "",
        "Loop overhead = (verify rule + other) / total wall time: the time not spent in model forwards "
        "(drafter forwards are under 'draft', prefill is counted in the total).",
        "",
    ]
    return "\n".join(lines)


def run_overhead(
    methods: tuple[str, ...] = DEFAULT_METHODS,
    choice: ModelChoice | None = None,
    new_tokens: int = 128,
    threads: int | None = 1,
    options: dict[str, Any] | None = None,
    out: str | Path = COST,
    name: str = "loop-overhead",
    command: str = "",
) -> dict:
    import torch

    from ..api import load
    from . import environment
    from .config import ModelChoice
    from .report import write_result

    if not methods:
        raise DraftVerifyError("--methods names no method")
    if threads is not None:
        torch.set_num_threads(threads)
    choice = choice or ModelChoice()
    rows = []
    for method in methods:
        pipe = load(**choice.load_args(), method=method, **(options or {}))
        pipe.generate(PROMPT, max_new_tokens=8)  # warm-up
        s = pipe.generate(PROMPT, max_new_tokens=new_tokens).stats
        t = s.time_total
        rows.append(
            {
                "method": method,
                "new_tokens": s.new_tokens,
                "target_calls": s.target_calls,
                "draft": 100 * s.time_draft / t,
                "target": 100 * s.time_target / t,
                "verify": 100 * s.time_verify / t,
                "other": 100 * s.time_other / t,
                "overhead": 100 * s.loop_overhead_fraction,
            }
        )
    result = {
        **environment.header(name, command),
        "threads": threads,
        "models": choice.target or f"the {choice.zoo} zoo",
        "new_tokens": new_tokens,
        "rows": rows,
    }
    return write_result(result, out, name, render)

"""What `--compile` compiles, compiling it up front, and whether it pays: one place for the CLI, the API and the bench.

torch.compile (inductor freezing, static shapes) builds one graph per model and verify width, and on a CPU each
graph takes tens of seconds. So:

- Only the widths the method uses are compiled (`compile_widths`): with a fixed gamma every verify is at most
  gamma + 1 tokens (a tree: its nodes + 1), so a model gets a plain one-token graph and one at the full width, and
  shorter drafts (no copy match, the last steps) pad up to it; gamma auto / heuristic vary the draft length by
  design, so their models keep the power-of-two buckets up to the widest. A forward wider than a model's widest
  graph (a lagging draft model catching up on many tokens) runs eagerly instead of compiling yet another graph.
- `precompile` compiles every graph before the first generation, with a line per graph, so the generation's own
  timings are the compiled ones; `compare` times one forward of each model eager vs compiled, from which the CLI
  says after how many tokens compilation pays for itself (`break_even_tokens`), or that it does not.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from time import perf_counter
from typing import Callable

import torch

from .backends.base import LMBackend, is_compiled
from .backends.hf.cached_lm import CachedLM
from .backends.hf.compiled_widths import WIDTH_BUCKETS
from .draft_length import make_draft_length, parse_gamma
from .drafters.base import Drafter, DraftModel


def compiled_models(target: LMBackend, drafter: Drafter) -> list[DraftModel]:
    """(model, lags) for each compiled model a run calls: the target, then the models the drafter declares
    (Drafter.models), each once."""
    found: list[DraftModel] = []
    for lm, lags in [DraftModel(target)] + drafter.models():
        if is_compiled(lm) and all(lm is not seen for seen, _ in found):
            found.append(DraftModel(lm, lags))
    return found


def max_verify_width(drafter: Drafter, gamma: int | str) -> int:
    """The widest verify forward a run of `drafter` at `gamma` needs (Drafter.verify_width of its longest draft)."""
    policy = make_draft_length(gamma, longest=drafter.longest_draft)
    return drafter.verify_width(int(getattr(policy, "max_gamma", getattr(policy, "gamma", 1))))


def compile_widths(max_width: int, fixed: bool) -> tuple[int, ...]:
    """The widths to compile for runs whose widest forward is max_width: (1, max_width) for a fixed draft length
    (shorter forwards pad up), else the power-of-two buckets below max_width and max_width itself."""
    if fixed:
        return tuple(sorted({1, max_width}))
    return tuple(b for b in WIDTH_BUCKETS if b < max_width) + (max_width,)


def plan(target: LMBackend, drafter: Drafter, gamma: int | str) -> list[CachedLM]:
    """Give every compiled model of this run the widths its method uses; return those models (none: eager run)."""
    models = [lm for lm, _ in compiled_models(target, drafter)]
    widths = compile_widths(max_verify_width(drafter, gamma), fixed=isinstance(parse_gamma(gamma), int))
    for lm in models:
        lm.widths = widths
    return models


def graph_count(models: list[CachedLM]) -> int:
    return sum(len(lm.widths) for lm in models)


@torch.inference_mode()
def precompile(
    target: LMBackend,
    drafter: Drafter,
    input_ids: torch.Tensor,
    positions: int,
    log: Callable[[str], None] | None = None,
) -> float:
    """Compile every graph of every compiled model for a request of `positions` decoder positions (prompt +
    max_new_tokens: the cache is sized per request, see CachedLM.check_fits), after prefilling input_ids [1, L];
    returns the seconds it took. The target verifies with hidden states when the drafter reads them (other graphs)."""
    started = perf_counter()
    models = [lm for lm, _ in compiled_models(target, drafter)]
    total, done = graph_count(models), 0
    hidden = bool(getattr(drafter, "needs_target_hidden", False))
    for lm in models:
        lm.check_fits(positions)
        for width in lm.widths:
            if input_ids.shape[1] + width > lm.window:
                continue
            begun = perf_counter()
            lm.start(input_ids)
            lm.forward(
                torch.zeros((input_ids.shape[0], width), dtype=torch.long, device=lm.device),
                want_hidden=hidden and lm is target,
            )
            lm.commit(0)
            done += 1
            if log is not None:
                log(f"compiled graph {done}/{total}: {lm.role} at width {width} ({perf_counter() - begun:.1f} s)")
    return perf_counter() - started


@dataclass
class Comparison:
    """Milliseconds of one forward of each compiled model at its usual width, eager (growing cache, as without
    --compile) and compiled."""

    roles: list[str] = field(default_factory=list)
    widths: list[int] = field(default_factory=list)
    eager_ms: list[float] = field(default_factory=list)
    compiled_ms: list[float] = field(default_factory=list)

    def saving_ms(self, draft_calls_per_target_call: float) -> float:
        """Milliseconds saved per target call: the target's saving plus each draft model's times its calls."""
        total = 0.0
        for role, eager, compiled in zip(self.roles, self.eager_ms, self.compiled_ms):
            total += (eager - compiled) * (1.0 if role == "target" else draft_calls_per_target_call)
        return total

    def describe(self) -> str:
        return ", ".join(
            f"{r} {c:.1f} ms compiled vs {e:.1f} ms eager (width {w})"
            for r, w, e, c in zip(self.roles, self.widths, self.eager_ms, self.compiled_ms)
        )


@torch.inference_mode()
def compare(target: LMBackend, drafter: Drafter, input_ids: torch.Tensor, repeats: int = 5) -> Comparison:
    """Time each compiled model's usual forward (the target at its widest compiled width, a draft model at width 1)
    eager and compiled after prefilling input_ids [1, L]; the median of `repeats` timed calls after one untimed."""
    result = Comparison()
    for lm, _ in compiled_models(target, drafter):
        width = max(lm.widths) if lm is target else 1
        eager = CachedLM(lm.model, role=lm.role)  # the same weights on a growing cache: the run without --compile
        times = []
        for model in (eager, lm):
            seconds = []
            for i in range(repeats + 1):
                model.start(input_ids)
                begun = perf_counter()
                model.forward(torch.zeros((input_ids.shape[0], width), dtype=torch.long, device=lm.device))
                if i:
                    seconds.append(perf_counter() - begun)
                model.commit(0)
            times.append(1000 * statistics.median(seconds))
        result.roles.append(lm.role)
        result.widths.append(width)
        result.eager_ms.append(times[0])
        result.compiled_ms.append(times[1])
    return result


def break_even_tokens(
    compile_seconds: float, comparison: Comparison, tokens_per_call: float, draft_calls_per_target_call: float
) -> float | None:
    """Generated tokens after which the compiled forwards have saved the compilation's seconds; None when they
    save nothing."""
    saving = comparison.saving_ms(draft_calls_per_target_call) / 1000
    if saving <= 0:
        return None
    return compile_seconds / saving * max(tokens_per_call, 1.0)

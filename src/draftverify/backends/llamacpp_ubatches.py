"""How llama.cpp splits a batch of rows on KV streams into micro-batches, and the filler that makes it split less.

On a context with one KV stream per sequence, llama.cpp decodes a batch in micro-batches of *equal* token counts
per sequence over a run of *consecutive* sequence ids (llama_batch_allocr::split_equal, sequential): rows of 1, 3,
5 and 8 new tokens take four micro-batches (1 each from all four, 2 each from the last three, 2 each from the last
two, 3 from the last), and every micro-batch is one more pass over the weights, which on a CPU costs as much as
several more tokens. A row whose padding is on its right (a ragged draft scored by the verify pass) may decode some
filler columns after its real ones (removed right after the decode) to join a longer row's level, so the batch
splits less: `filled_counts` picks how far each such row goes, by a cost of micro-batches and tokens that
`MicroBatchCost` fits to the context's own timings.
"""

from __future__ import annotations

from itertools import combinations

PRIOR_UBATCH_TOKENS = 8.0  # before any timing: one more micro-batch costs about as much as 8 more tokens
EXACT_LEVELS = 8  # up to this many distinct row lengths every set of kept levels is tried; above, floors only


def micro_batches(counts: list[int]) -> int:
    """Micro-batches llama.cpp's split_equal (sequential) makes of a batch whose sequence s holds counts[s] tokens
    (0: not in the batch): each takes the same number from every sequence of the run of consecutive ids that starts
    at the first sequence with tokens left, as many as the run's shortest has left."""
    remaining = list(counts)
    made = 0
    while True:
        first = next((s for s, left in enumerate(remaining) if left > 0), None)
        if first is None:
            return made
        end = first
        while end + 1 < len(remaining) and remaining[end + 1] > 0:
            end += 1
        take = min(remaining[first : end + 1])
        for s in range(first, end + 1):
            remaining[s] -= take
        made += 1


def filled_counts(counts: list[int], room: list[int], ubatch_tokens: float) -> list[int]:
    """Tokens to decode for each sequence (counts[s] real, up to room[s] >= counts[s] when filler may follow them)
    that minimise micro_batches * ubatch_tokens + tokens: each fillable sequence goes up to the lowest kept level at
    or above its own count, the kept levels being a subset of the counts (every subset up to EXACT_LEVELS distinct
    counts, else raising the shortest ones to a common floor)."""
    levels = sorted({c for c in counts if c > 0})
    if len(levels) <= 1 or all(r == c for r, c in zip(room, counts)):
        return list(counts)

    def raised(kept: tuple[int, ...]) -> list[int]:
        out = []
        for c, r in zip(counts, room):
            target = next((k for k in kept if k >= c), c) if c > 0 else 0
            out.append(target if target <= r else c)
        return out

    def cost(filled: list[int]) -> float:
        return micro_batches(filled) * ubatch_tokens + sum(filled)

    top = levels[-1]
    if len(levels) <= EXACT_LEVELS:
        below = levels[:-1]
        choices = [(*kept, top) for size in range(len(below) + 1) for kept in combinations(below, size)]
    else:
        choices = [(floor, *(k for k in levels if k > floor)) for floor in levels]
    best = list(counts)
    best_cost = cost(best)
    for kept in choices:
        filled = raised(kept)
        if (c := cost(filled)) < best_cost:
            best, best_cost = filled, c
    return best


class MicroBatchCost:
    """seconds ~ a * micro-batches + b * tokens, fitted by least squares (no intercept: every decode is at least one
    micro-batch) to a context's own decodes, from a prior worth a few decodes; `ubatch_tokens` = a / b."""

    def __init__(self, prior_weight: float = 4.0):
        # normal equations' sums, seeded with prior decodes of (1 micro-batch, 1 token) and (1, 9) at a = 8 b, b = 1
        self.uu = self.ut = self.tt = self.us = self.ts = 0.0
        for u, t in ((1.0, 1.0), (1.0, 9.0)):
            self.add(u, t, PRIOR_UBATCH_TOKENS * u + t, prior_weight)
        self._scale = None  # seconds per unit of the prior, set by the first real decode

    def add(self, ubatches: float, tokens: float, seconds: float, weight: float = 1.0) -> None:
        self.uu += weight * ubatches * ubatches
        self.ut += weight * ubatches * tokens
        self.tt += weight * tokens * tokens
        self.us += weight * ubatches * seconds
        self.ts += weight * tokens * seconds

    def observe(self, ubatches: int, tokens: int, seconds: float) -> None:
        """A timed decode, in the prior's units (its seconds scaled so the prior's token costs 1 at the first one)."""
        if self._scale is None:
            self._scale = (PRIOR_UBATCH_TOKENS * ubatches + tokens) / max(seconds, 1e-9)
        self.add(ubatches, tokens, seconds * self._scale)

    @property
    def ubatch_tokens(self) -> float:
        det = self.uu * self.tt - self.ut * self.ut
        if det <= 0:
            return PRIOR_UBATCH_TOKENS
        a = (self.us * self.tt - self.ts * self.ut) / det
        b = (self.ts * self.uu - self.us * self.ut) / det
        if a <= 0 or b <= 0:
            return PRIOR_UBATCH_TOKENS if b > 0 else 64.0
        return a / b

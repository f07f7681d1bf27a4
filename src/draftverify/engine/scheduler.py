"""The rows of a generation (one row is a batch of one): which are still decoding, what each has emitted, when each
ends, and rows leaving and joining the batch between steps (continuous batching, with typed RowRequests)."""

from __future__ import annotations

import os

import torch

from ..backends.base import LMBackend
from ..drafters.base import Drafter
from ..errors import DraftVerifyError
from ..sampling import RowParams, params_rows, row_params
from ..types import (
    DecodingState,
    GenerationOutput,
    GenerationStats,
    RowLogprobs,
    RowRequest,
    SamplingParams,
    left_padded,
    trim_rows,
)
from .logprobs import LogprobsRecorder
from .processors import Processors


def checked_requests(joining) -> list[RowRequest]:
    """What admit() returned, as a list of RowRequest (refused otherwise, naming what to build instead)."""
    joining = list(joining or ())
    for row in joining:
        if not isinstance(row, RowRequest):
            raise DraftVerifyError(
                f"admit() must return a list of RowRequest, got {type(row).__name__} {row!r}; "
                "build each joining row as RowRequest(prompt_ids, max_new_tokens, seed=..., "
                "first_token_allowed=..., params=..., processing=...) (from draftverify import RowRequest)"
            )
    return joining


def fresh_seed() -> int:
    return int.from_bytes(os.urandom(8), "little") >> 1


def _generator_seed(params: SamplingParams | RowParams, batch: int) -> int:
    """The shared generator's seed (uncoupled sampling draws from it): the given seed; with per-row settings the
    first sampled row's seed when every sampled row has one, so a fully seeded batch is reproducible; else fresh."""
    if isinstance(params, SamplingParams):
        return params.seed if params.seed is not None else fresh_seed()
    sampled = [p.seed for p in params_rows(params, batch) if not p.greedy]
    seeded = [s for s in sampled if s is not None]
    return seeded[0] if sampled and len(seeded) == len(sampled) else fresh_seed()


def row_generator(
    params: SamplingParams | RowParams, batch: int, seeds: list[int | None] | None, joins: bool, device: torch.device
) -> tuple[torch.Generator | None, list[int] | None]:
    """Our own generator (the process-global RNG is never reseeded) and each row's coupled-noise seed (a fresh
    one where none is given); (None, None) when every row is greedy and none will join (they may sample)."""
    if params.greedy and not joins:
        return None, None
    generator = torch.Generator(device=device)
    generator.manual_seed(_generator_seed(params, batch))
    given = seeds if seeds is not None else [p.seed for p in params_rows(params, batch)]
    return generator, [s if s is not None else fresh_seed() for s in given]


class Scheduler:
    """Bookkeeping of the rows: which are still decoding (`active`, original indices in batch order), what each
    has emitted, when each ends (stops: each row's tokens that end it, EOS and its own stop tokens); rows leave
    (leave) and join (join) between steps."""

    def __init__(self, limits: list[int], prompts: list[list[int]], stops: list[set[int]]):
        self.batch = len(prompts)
        self.limits = list(limits)
        self.prompts = prompts
        self.stops = list(stops)
        self.active = list(range(self.batch))
        self.new: list[list[int]] = [[] for _ in prompts]
        self.ended: list[bool] = [False] * self.batch
        self.ending = False  # some row ended in this step's emitted(): leave() has rows to drop

    def most_remaining(self) -> int:
        if len(self.active) == 1:  # one row: no generator to run
            row = self.active[0]
            return self.limits[row] - len(self.new[row])
        return max(self.limits[r] - len(self.new[r]) for r in self.active)

    def emitted(self, tokens: list[list[int]], accepted: list[int]) -> list[list[int]]:
        """Each active row's emitted tokens this step: accepted drafts + the target's token, cut after the first
        of its stop tokens and at the row's max_new_tokens."""
        out = []
        for i, row in enumerate(self.active):
            toks = tokens[i][: accepted[i] + 1]
            stops = self.stops[row]
            for j, t in enumerate(toks):
                if t in stops:
                    toks = toks[: j + 1]
                    self.ended[row] = self.ending = True
                    break
            toks = toks[: self.limits[row] - len(self.new[row])]
            self.new[row].extend(toks)
            if len(self.new[row]) >= self.limits[row]:
                self.ended[row] = self.ending = True
            out.append(toks)
        return out

    def padded(self, emitted: list[list[int]], device) -> torch.Tensor:
        """[B_original, k] of this step's tokens, -1 where a row emitted fewer (or has left the batch)."""
        width = max((len(r) for r in emitted), default=0)
        grid = torch.full((self.batch, width), -1, dtype=torch.long)
        for i, row in enumerate(self.active):
            if emitted[i]:
                grid[row, : len(emitted[i])] = torch.tensor(emitted[i])
        return grid.to(device)

    def finish(self, stop_rows) -> torch.Tensor | None:
        """Mark rows the caller stopped; returns keep [B_active] (bool) when some rows leave and some stay, else
        None (nothing to drop: none left, or all left and the generation is over)."""
        for row in stop_rows or ():
            self.ended[int(row)] = True
        keep = [not self.ended[row] for row in self.active]
        if all(keep):
            return None
        self.active = [row for row, k in zip(self.active, keep) if k]
        return torch.tensor(keep) if self.active else None

    def leave(
        self, stop_rows, target: LMBackend, drafter: Drafter, state: DecodingState, processors: Processors
    ) -> None:
        """Rows that ended (a stop token, max_new_tokens, or stopped by the caller: stop_rows) leave the target, the
        drafter, the state and the processors; when none is left the generation is over and nothing needs dropping."""
        if not (stop_rows or self.ending):  # nobody ended this step
            return
        self.ending = False
        keep = self.finish(stop_rows)
        if keep is None:
            return
        target.drop_rows(keep)
        drafter.drop_rows(keep)
        rows = keep.to(state.tokens.device)
        state.tokens, state.lengths = trim_rows(state.tokens[rows], state.lengths[rows])
        kept = keep.tolist()
        processors.drop(kept)
        if state.seeds is not None:
            state.seeds = [s for s, k in zip(state.seeds, kept) if k]
        if isinstance(state.params, RowParams):
            state.params = row_params([p for p, k in zip(state.params.rows, kept) if k])

    def join(
        self,
        joining,
        target: LMBackend,
        drafter: Drafter,
        state: DecodingState,
        processors: Processors,
        scores: LogprobsRecorder | None = None,
    ) -> int:
        """Continuous batching: prefill the rows admit() returned (RowRequests) and append them to the batch
        (target, drafter, state, logits processors: the first-token constraints of healing, penalties, ...; the
        log-probabilities they ask for); a row without its own SamplingParams takes the batch's first row's.
        Returns the prompt tokens that joined."""
        requests = checked_requests(joining)
        checked = processors.check(
            [r.processing for r in requests], [r.first_token_allowed for r in requests], len(requests)
        )
        prompts = [r.prompt_ids for r in requests]
        asked = [r.logprobs for r in requests]
        if scores is None and any(a is not None for a in asked):
            raise DraftVerifyError("rows that ask for logprobs join a generation started with logprobs (or admit)")
        for request in requests:
            target.check_fits(len(request.prompt_ids) + request.max_new_tokens)
            drafter.bind(target, len(request.prompt_ids) + request.max_new_tokens)
        if scores is not None:
            LogprobsRecorder.check(target, asked)
        ids, mask = left_padded(prompts, 0, state.tokens.device)
        keep = {"prompt_logits": True} if scores is not None and scores.add(asked, prompts) else {}
        target.join_rows(ids, mask, **keep)  # type: ignore[attr-defined]  # only supports_rows backends join
        drafter.join_rows(ids, mask)
        total = max(ids.shape[1], state.tokens.shape[1])

        def pad(t: torch.Tensor) -> torch.Tensor:  # [R, W] -> [R, total], zeros on the left
            return torch.cat([t.new_zeros((t.shape[0], total - t.shape[1])), t], dim=1)

        state.tokens = torch.cat([pad(state.tokens), pad(ids)])
        state.lengths = torch.cat([state.lengths, mask.long().sum(dim=1)])
        batch_rows = params_rows(state.params, state.tokens.shape[0] - len(requests))
        state.params = row_params(batch_rows + [r.params if r.params is not None else batch_rows[0] for r in requests])
        if state.seeds is not None:
            state.seeds = state.seeds + [r.seed if r.seed is not None else fresh_seed() for r in requests]
        self.stops.extend(processors.add(checked, prompts))
        self.active.extend(range(self.batch, self.batch + len(prompts)))
        self.batch += len(prompts)
        self.prompts.extend(prompts)
        self.limits.extend(r.max_new_tokens for r in requests)
        self.new.extend([] for _ in prompts)
        self.ended.extend(False for _ in prompts)
        return sum(len(r) for r in prompts)

    def output(
        self, input_ids: torch.Tensor, stats: GenerationStats, logprobs: list[RowLogprobs | None] | None = None
    ) -> GenerationOutput:
        """new_tokens [B, max new] and sequences [B, max prompt + new] (each row's prompt and new tokens),
        right-padded with -1; logprobs: each row's (engine/logprobs.py), when some row asked."""

        def grid(lists: list[list[int]]) -> torch.Tensor:  # one tensor made from padded lists: one torch call
            width = max((len(r) for r in lists), default=0)
            padded = [r + [-1] * (width - len(r)) for r in lists]
            return torch.tensor(padded, dtype=torch.long).reshape(len(lists), width).to(input_ids.device)

        return GenerationOutput(
            sequences=grid([p + n for p, n in zip(self.prompts, self.new)]),
            new_tokens=grid(self.new),
            stats=stats,
            rows=[list(r) for r in self.new],
            logprobs=logprobs,
        )

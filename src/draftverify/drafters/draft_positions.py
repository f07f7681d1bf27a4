"""Where a draft model's next-token distributions come from, one draft position at a time (drafters/model.py reads
them in its drafting loop).

DraftForwards: one draft forward per draft token (Leviathan's M_q drafting gamma tokens autoregressively): the
committed tokens the draft's cache has not seen, then each token just drafted.
StagedForwards (staged drafting, one row): each forward also scores the prompt-lookup continuation of the text so
far, so while the draft model's own choices equal the looked-up tokens, the next positions come out of the same
forward; the cache drops the looked-up tokens past the first the draft did not choose. The proposals are the same
as DraftForwards' (each position is the draft's own distribution after the draft's own tokens), only cheaper.

Each forward's numbers (the greedy picks, the max q the stop rules read) are computed in one tensor op over all its
positions and read as Python numbers: after a llama.cpp forward has streamed the weights through the caches, every
small tensor op pays its dispatch again.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..backends.base import takes_host_ids
from ..sampling import argmax, host_array, probs_from_logits
from ..types import DecodingState, SamplingParams
from .prompt_lookup import find_continuation


def fed_width(pending: torch.Tensor | list[list[int]]) -> int:
    """Columns of what a draft forward feeds first [B, w] (a tensor or rows of ints)."""
    return len(pending[0]) if isinstance(pending, list) else pending.shape[1]


@dataclass
class DraftPosition:
    """The draft model's distribution for the next draft token of every row, and what the drafting loop reads of it.

    q [B, V]: the draft's probabilities (filtered as the target's p will be), or None for a greedy draft no stop
    rule reads (a greedy draft is a deterministic proposal, q one-hot at its token: Draft.q_probs None, and no
    softmax over the vocabulary is paid per token); greedy: each row's argmax (greedy sampling only, else None);
    top: each row's max q (None when no stop rule reads it); sure: max q > the confidence threshold, compared in
    float32 as q is (None without a confidence stop); looked: the prompt lookup's token at this position (staged
    drafting), None elsewhere."""

    q: torch.Tensor | None
    greedy: list[int] | None
    top: list[float] | None
    sure: list[bool] | None
    looked: int | None = None


@dataclass(frozen=True)
class PositionNeeds:
    """Which numbers of each position the drafting loop reads: greedy picks, max q, a confidence threshold (0: none)."""

    greedy: bool
    top: bool
    confidence: float

    @property
    def q(self) -> bool:
        """Whether q itself is needed: to draw from it, or for a stop rule's max q."""
        return not self.greedy or self.top or self.confidence > 0


class DraftForwards:
    """One draft forward per draft token. Starts from the committed tokens the draft's cache has not seen
    (ModelDrafter.unseen); `took` feeds each drafted token to the next forward."""

    def __init__(self, drafter, state: DecodingState, needs: PositionNeeds):
        self.drafter = drafter
        self.lm = drafter.lm
        self.params = state.params
        self.needs = needs
        self.device = state.device
        self.pending, self.new_valid = drafter.unseen(state)  # [B, w] (a tensor or ints), and [B, w] or None
        self.drawn: torch.Tensor | list[int] | None = None  # the tokens drawn last, fed first by the next forward
        self.host_ids = takes_host_ids(self.lm)  # a draft model that reads ints: no tensor made per draft token

    def next(self, room: int) -> DraftPosition:
        """The next draft position (room: draft tokens this step may still take, >= 1)."""
        return self._forward(self._pending(), [])[0]

    def took(self, token: torch.Tensor | list[int], first: int) -> None:
        """The drafting loop drew token ([B] tensor, or each row's id as Python ints; row 0's: first) at the last
        position read."""
        self.drawn = token

    def _pending(self) -> torch.Tensor | list[list[int]]:
        """What the next forward feeds first [B, w]: the committed tokens the cache has not seen (the step's first
        forward), else the tokens drawn last; Python ints where the draft model takes them and they are ints."""
        if self.drawn is not None:
            drawn, self.drawn = self.drawn, None
            if isinstance(drawn, torch.Tensor):
                self.pending = drawn[:, None]
            elif self.host_ids:
                self.pending = [[t] for t in drawn]  # [B][1]
            else:
                self.pending = torch.tensor([[t] for t in drawn], device=self.device)  # [B, 1]
        return self.pending

    def finish(self) -> None:
        """The draft is complete: nothing left to undo (StagedForwards drops unchosen looked-up tokens)."""

    def _forward(self, pending: torch.Tensor | list[list[int]], looked: list[int]) -> list[DraftPosition]:
        """One draft forward of pending [B, w] and the looked-up tokens [L]: the positions after the pending tokens
        and after each looked-up one (L + 1 of them, in order)."""
        fed: torch.Tensor | list[list[int]] = pending
        if looked:
            if isinstance(pending, list):
                fed = [row + looked for row in pending]
            else:
                fed = torch.cat([pending, pending.new_tensor([looked])], dim=1)  # [B, w + L]
        # the pending tokens but the last are only fed (their logits are not read, nor made)
        logits = self.lm.forward(fed, new_valid=self.new_valid, logits_to_keep=len(looked) + 1).logits  # [B, L + 1, V]
        self.new_valid = None
        self.drafter.forward_calls += 1
        needs = self.needs
        host = host_array(logits) if needs.greedy else None
        if host is not None:  # a host backend's logits (llama.cpp's buffer): read through NumPy, no torch call
            return self._host_positions(host, looked)
        scored = logits  # [B, L + 1, V]
        if not needs.q:  # greedy, no stop rule: the argmax of the logits is the argmax of q
            argmaxes = argmax(scored).tolist()  # [B][L + 1]
            return [
                DraftPosition(
                    q=None, greedy=[row[j] for row in argmaxes], top=None, sure=None, looked=self._looked(looked, j)
                )
                for j in range(len(looked) + 1)
            ]
        q = probs_from_logits(scored, self.params)  # [B, L + 1, V]
        top = q.amax(dim=-1) if needs.top or needs.confidence > 0 else None  # [B, L + 1]
        picks = argmax(q).tolist() if needs.greedy else None  # [B][L + 1]
        tops = top.tolist() if needs.top and top is not None else None
        sure = (top > needs.confidence).tolist() if needs.confidence > 0 and top is not None else None
        return [
            DraftPosition(
                q=q[:, j],
                greedy=[row[j] for row in picks] if picks is not None else None,
                top=[row[j] for row in tops] if tops is not None else None,
                sure=[row[j] for row in sure] if sure is not None else None,
                looked=self._looked(looked, j),
            )
            for j in range(len(looked) + 1)
        ]

    def _host_positions(self, scored: np.ndarray, looked: list[int]) -> list[DraftPosition]:
        """The greedy positions of one forward from its logits as a NumPy array [B, L + 1, V] (a host backend's
        buffer): each row's argmax and, where a stop rule reads it, its max q = 1 / sum(exp(logits - max)) in
        float32, the untempered softmax's peak (probs_from_logits for greedy params); q itself is not made (a
        greedy draft is a deterministic proposal)."""
        needs = self.needs
        picks = scored.argmax(axis=-1).tolist()  # [B][L + 1]
        tops = sure = None
        if needs.top or needs.confidence > 0:
            shifted = scored - scored.max(axis=-1, keepdims=True)
            peak = np.float32(1.0) / np.exp(shifted, dtype=np.float32).sum(axis=-1, dtype=np.float32)  # [B, L + 1]
            tops = peak.tolist() if needs.top else None
            sure = (peak > np.float32(needs.confidence)).tolist() if needs.confidence > 0 else None
        return [
            DraftPosition(
                q=None,
                greedy=[row[j] for row in picks],
                top=[row[j] for row in tops] if tops is not None else None,
                sure=[row[j] for row in sure] if sure is not None else None,
                looked=self._looked(looked, j),
            )
            for j in range(len(looked) + 1)
        ]

    @staticmethod
    def _looked(looked: list[int], j: int) -> int | None:
        return looked[j] if j < len(looked) else None


class StagedForwards(DraftForwards):
    """Staged drafting on one unpadded row: each forward also scores up to `lookup_tokens` looked-up tokens
    (find_continuation of the row's text and draft so far, n-grams `ngrams` = (longest, shortest)); the positions
    after the ones the draft chose come from the same forward."""

    def __init__(
        self, drafter, state: DecodingState, needs: PositionNeeds, lookup_tokens: int, ngrams: tuple[int, int]
    ):
        super().__init__(drafter, state, needs)
        self.lookup_tokens = lookup_tokens
        self.ngrams = ngrams
        self.text = list(state.row_ids(0))  # the row's committed tokens, then its draft so far
        self.ready: list[DraftPosition] = []  # positions the last forward scored that the draft has not reached
        self.last: DraftPosition | None = None  # the position the loop read last
        self.held = 0  # the draft cache's length before the last forward
        self.fed = 0  # tokens the last forward fed: pending and looked-up
        self.kept = 0  # of those looked-up, the ones the draft chose (their cells stay)
        self.looked = 0

    def next(self, room: int) -> DraftPosition:
        if self.ready:  # the draft chose the looked-up token before this position: its forward scored it already
            self.last = self.ready.pop(0)
            return self.last
        self.finish()
        looked = self._looked_up(room)
        pending = self._pending()
        self.held, self.fed, self.kept, self.looked = self.lm.length, fed_width(pending), 0, len(looked)
        self.last, *self.ready = self._forward(pending, looked)
        return self.last

    def took(self, token: torch.Tensor | list[int], first: int) -> None:
        super().took(token, first)
        self.text.append(first)
        if self.last is not None and self.last.looked is not None and first == self.last.looked:
            self.kept += 1
        else:
            self.ready = []  # the rest of the forward followed tokens the draft did not choose

    def finish(self) -> None:
        """Drop the looked-up tokens the draft did not choose from its cache."""
        if self.kept < self.looked:
            self.lm.rollback(self.held + self.fed + self.kept)
        self.looked = self.kept = 0
        self.ready = []

    def _looked_up(self, room: int) -> list[int]:
        """The prompt-lookup continuation scored in the same forward as the pending token, leaving one of the
        `room` draft tokens for the position after it."""
        room = min(self.lookup_tokens, room - 1)
        if room <= 0:
            return []
        return find_continuation(self.text, self.ngrams[0], self.ngrams[1], room)


def position_needs(params, fallback_threshold: float, confidence: float) -> PositionNeeds:
    """What the drafting loop reads per position under these sampling settings and stop rules."""
    greedy = isinstance(params, SamplingParams) and params.greedy
    return PositionNeeds(greedy=greedy, top=fallback_threshold > 0, confidence=confidence)

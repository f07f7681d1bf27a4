"""When a draft model's draft ends before gamma tokens: BiLD's fallback and the length policy's confidence stop,
both read off the draft's max q at each position (drafters/draft_positions.py DraftPosition).

Fallback (BiLD's alpha_FB, Algorithm 1 line 4: the small model's token only if max p_S > alpha_FB; section 3.3's
prose says "< alpha_FB", the two differ only at equality): drafting stops *before* the first position whose max q is
not above alpha_FB in every row, handing that position to the target. 0 never falls back and 1 always does, even
when a float softmax rounds to exactly 1.

Confidence stop (gamma `conf`, DecodingState.draft_confidence): the draft ends *at* (not before) its first token
whose max q is <= the threshold; in a batch it ends when every row has reached such a token, and every row keeps
the batch's length: a row's own stop would save no draft forward (the batch's goes on for the others) and, on a
backend that scores rows densely (or in micro-batches of equal counts, as llama.cpp does), little or nothing of the
verify pass, while the tokens it drafts past that stop are its own draws from q and are sometimes right. With staged
drafting, a token that prompt lookup proposes too counts as confident whatever its max q (`lookup_confirms`): two
drafters that agree are right far more often than the draft's q says.

Both read only the committed text and the draft, so every exact verifier stays exact.
"""

from __future__ import annotations

from .draft_positions import DraftPosition


class DraftStops:
    """The stop rules of one draft (a fresh one per propose: the confidence stop tracks each row)."""

    def __init__(self, fallback_threshold: float, confidence: float, lookup_confirms: bool):
        self.fallback_threshold = fallback_threshold
        self.confidence = confidence
        self.lookup_confirms = lookup_confirms
        self.drafting: list[bool] | None = None  # per row: still confident (confidence stop)

    def falls_back(self, position: DraftPosition) -> bool:
        """BiLD: no row's max q is above alpha_FB here, so the draft ends before this position."""
        if position.top is None or self.fallback_threshold <= 0:
            return False
        return max(position.top) <= self.fallback_threshold

    def ends_at(self, position: DraftPosition, token: int) -> bool:
        """The confidence stop, after the loop drew `token` (row 0's) here: True when every row has now drafted
        a token it is not confident of."""
        if position.sure is None:
            return False
        confirmed = self.lookup_confirms and position.looked is not None and token == position.looked
        if self.drafting is None:
            self.drafting = [True] * len(position.sure)
        self.drafting = [drafting and (sure or confirmed) for drafting, sure in zip(self.drafting, position.sure)]
        return not any(self.drafting)

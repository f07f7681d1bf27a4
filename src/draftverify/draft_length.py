"""How many tokens to draft each step: fixed gamma, Hugging Face's heuristic, or Theorem 8 with measured alpha, c."""
from __future__ import annotations

from abc import ABC, abstractmethod

from .errors import DraftVerifyError
from .theory import optimal_gamma


class DraftLength(ABC):
    @abstractmethod
    def next(self) -> int:
        """gamma for the coming step (>= 1)."""

    def update(self, drafted: int, accepted: int, rejected: bool, draft_seconds: float, target_seconds: float) -> None:
        """Feedback after a step."""


class FixedGamma(DraftLength):
    def __init__(self, gamma: int):
        self.gamma = gamma

    def next(self) -> int:
        return self.gamma


class HeuristicGamma(DraftLength):
    """Hugging Face assisted generation's schedule: +2 after a fully accepted draft, -1 (floor 1) otherwise."""

    def __init__(self, gamma: int, max_gamma: int = 32):
        self.gamma = gamma
        self.max_gamma = max_gamma

    def next(self) -> int:
        return self.gamma

    def update(self, drafted, accepted, rejected, draft_seconds, target_seconds) -> None:
        if drafted == 0:
            return
        self.gamma = min(self.max_gamma, self.gamma + 2) if not rejected else max(1, self.gamma - 1)


class AutoGamma(DraftLength):
    """Leviathan section 3.5: gamma maximising Theorem 8 for the alpha and c measured so far in this run.

    alpha is the accepted / judged ratio with a weak prior (alpha = 0.5 worth 2 tokens) so early steps explore;
    c is the drafter's seconds per drafted token over the target's seconds per call.
    """

    def __init__(self, gamma: int = 4, max_gamma: int = 16):
        self.gamma = gamma
        self.max_gamma = max_gamma
        self.accepted = 1.0
        self.judged = 2.0
        self.draft_seconds = 0.0
        self.drafted = 0
        self.target_seconds = 0.0
        self.calls = 0

    @property
    def alpha(self) -> float:
        return self.accepted / self.judged

    @property
    def c(self) -> float:
        if not self.drafted or not self.calls or self.target_seconds <= 0:
            return 0.0
        return (self.draft_seconds / self.drafted) / (self.target_seconds / self.calls)

    def next(self) -> int:
        return self.gamma

    def update(self, drafted, accepted, rejected, draft_seconds, target_seconds) -> None:
        self.accepted += accepted
        self.judged += accepted + int(rejected)
        self.draft_seconds += draft_seconds
        self.drafted += drafted
        self.target_seconds += target_seconds
        self.calls += 1
        alpha = min(self.alpha, 1.0 - 1e-6)
        self.gamma = max(1, optimal_gamma(alpha, self.c, max_gamma=self.max_gamma).gamma)


def make_draft_length(gamma: int | str) -> DraftLength:
    """gamma: an integer >= 1, "heuristic" (start at 5, as Hugging Face does) or "auto"."""
    if isinstance(gamma, str):
        if gamma == "auto":
            return AutoGamma()
        if gamma == "heuristic":
            return HeuristicGamma(5)
        if gamma.isdecimal():
            gamma = int(gamma)
        else:
            raise DraftVerifyError(f"gamma must be an integer >= 1, 'heuristic' or 'auto', got {gamma!r}")
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise DraftVerifyError(f"gamma (draft length) must be an integer >= 1, 'heuristic' or 'auto', got {gamma!r}")
    return FixedGamma(gamma)

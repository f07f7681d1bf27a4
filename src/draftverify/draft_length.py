"""How many tokens to draft each step: fixed gamma, Hugging Face's heuristic, or Theorem 8 with measured alpha, c."""
from __future__ import annotations

from abc import ABC, abstractmethod

from .errors import DraftVerifyError


class DraftLength(ABC):
    reads_timers: bool = False  # the loop synchronises the device before timing a step only for policies that read it

    @abstractmethod
    def next(self) -> int:
        """gamma for the coming step (>= 1)."""

    def drafting_folded(self) -> None:
        """Told once before generation when the drafter drafts inside the target's verify forward (heads, BiTA):
        drafting then has no cost of its own, whatever the draft timer shows."""

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


class StepCosts:
    """Timings AutoGamma learns c and the verify cost from; a Pipeline keeps one across its calls, so the cost
    model is calibrated once per loaded pipeline and each later call starts from it instead of from scratch.

    The first step at each draft length is not recorded: it pays one-time costs (kernel selection and buffer
    allocation for a new input shape, lazy initialisation) that no later step pays, and in a cold process they
    dwarf the step itself, which used to drive gamma auto to short drafts and below plain decoding.
    Target seconds per call are fitted as a + b * (tokens scored) by least squares.
    """

    def __init__(self) -> None:
        self.seen_lengths: set[int] = set()
        self.folded = False
        self.draft_seconds = 0.0
        self.drafted = 0
        self.calls = 0
        self.sum_n = self.sum_nn = self.sum_t = self.sum_nt = 0.0

    def record(self, drafted: int, draft_seconds: float, target_seconds: float) -> None:
        if drafted not in self.seen_lengths:
            self.seen_lengths.add(drafted)
            return
        self.draft_seconds += draft_seconds
        self.drafted += drafted
        n = drafted + 1
        self.calls += 1
        self.sum_n += n
        self.sum_nn += n * n
        self.sum_t += target_seconds
        self.sum_nt += n * target_seconds

    @property
    def known(self) -> bool:
        return self.calls > 0 and self.sum_t > 0

    def target_seconds(self, tokens: int) -> float:
        """Fitted seconds of one target call scoring `tokens` positions (slope clamped at >= 0)."""
        mean_n, mean_t = self.sum_n / self.calls, self.sum_t / self.calls
        var_n = self.sum_nn / self.calls - mean_n**2
        slope = max(0.0, (self.sum_nt / self.calls - mean_n * mean_t) / var_n) if var_n > 1e-9 else 0.0
        return max(mean_t + slope * (tokens - mean_n), 1e-12)

    def drafting_folded(self) -> None:
        self.folded = True

    @property
    def c(self) -> float:
        if self.folded:
            return 0.0
        if not self.drafted or not self.known:
            return 0.0
        return (self.draft_seconds / self.drafted) / self.target_seconds(1)


class AutoGamma(DraftLength):
    """Leviathan section 3.5: gamma maximising Theorem 8 for the alpha and c measured so far.

    alpha is this run's accepted / judged ratio with a weak prior (alpha = 0.5 worth 2 tokens) so early steps
    explore; c is the drafter's seconds per drafted token over the target's seconds per single-token call.
    Theorem 8 assumes verifying gamma + 1 tokens costs one target step; on a CPU it costs more, so the target's
    cost is fitted against tokens scored (StepCosts) and gamma maximises E(tokens) / (gamma * c + verify_cost(gamma)):
    with a flat fit this is Theorem 8 exactly. Until a timing is known gamma stays at its start value (4, the
    best fixed length of the code-zoo benchmark for both the draft model and prompt lookup).
    """

    reads_timers = True

    def __init__(self, gamma: int = 4, max_gamma: int = 16, costs: StepCosts | None = None):
        self.gamma = gamma
        self.max_gamma = max_gamma
        self.costs = costs if costs is not None else StepCosts()
        self.accepted = 1.0
        self.judged = 2.0

    @property
    def alpha(self) -> float:
        return self.accepted / self.judged

    @property
    def c(self) -> float:
        return self.costs.c

    def target_seconds(self, tokens: int) -> float:
        return self.costs.target_seconds(tokens)

    def drafting_folded(self) -> None:
        self.costs.drafting_folded()

    @property
    def folded(self) -> bool:
        return self.costs.folded

    def next(self) -> int:
        return self.gamma

    def update(self, drafted, accepted, rejected, draft_seconds, target_seconds) -> None:
        from .theory import walltime_factor

        self.accepted += accepted
        self.judged += accepted + int(rejected)
        self.costs.record(drafted, draft_seconds, target_seconds)
        if not self.costs.known:
            return
        alpha, c = min(self.alpha, 1.0 - 1e-6), self.c
        single = self.target_seconds(1)
        factors = {g: walltime_factor(alpha, g, c, verify_cost=self.target_seconds(g + 1) / single)
                   for g in range(1, self.max_gamma + 1)}
        self.gamma = max(factors, key=lambda g: (factors[g], -g))  # ties go to the shorter draft


def parse_gamma(gamma: object) -> int | str:
    """Validate a draft length: an integer >= 1 (or its decimal string), "heuristic" or "auto"."""
    if isinstance(gamma, str):
        if gamma in ("auto", "heuristic"):
            return gamma
        if not gamma.isdecimal():
            raise DraftVerifyError(f"gamma must be an integer >= 1, 'heuristic' or 'auto', got {gamma!r}")
        gamma = int(gamma)
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise DraftVerifyError(f"gamma (draft length) must be an integer >= 1, 'heuristic' or 'auto', got {gamma!r}")
    return gamma


def make_draft_length(gamma: int | str, costs: StepCosts | None = None) -> DraftLength:
    """gamma: an integer >= 1, "heuristic" (start at 5, as Hugging Face does) or "auto" (costs: timings to
    start from and to add to, e.g. a Pipeline's)."""
    gamma = parse_gamma(gamma)
    if gamma == "auto":
        return AutoGamma(costs=costs)
    if gamma == "heuristic":
        return HeuristicGamma(5)
    return FixedGamma(gamma)

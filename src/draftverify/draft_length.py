"""How many tokens to draft each step: fixed gamma, Hugging Face's heuristic, or Theorem 8 with measured alpha, c."""
from __future__ import annotations

from abc import ABC, abstractmethod

from .errors import DraftVerifyError


class DraftLength(ABC):
    reads_timers: bool = False  # the loop synchronises the device before timing a step only for policies that read it

    @abstractmethod
    def next(self, rows: int = 1) -> int:
        """gamma for the coming step of a batch of `rows` rows: >= 1, or 0 for a plain decoding step (no draft)."""

    def drafting_folded(self) -> None:
        """Told once before generation when the drafter drafts inside the target's verify forward (heads, BiTA):
        drafting then has no cost of its own, whatever the draft timer shows."""

    def update(self, drafted: int, accepted: int, rejected: int, draft_seconds: float, target_seconds: float,
               rows: int = 1) -> None:
        """Feedback after a step of `rows` rows: the target scored rows x (drafted + 1) tokens; accepted draft
        tokens and rejected (rows that stopped at a rejected draft token; a bool for one row) add up the rows."""


class FixedGamma(DraftLength):
    def __init__(self, gamma: int):
        self.gamma = gamma

    def next(self, rows: int = 1) -> int:
        return self.gamma


class HeuristicGamma(DraftLength):
    """Hugging Face assisted generation's schedule: +2 after a fully accepted draft, -1 (floor 1) otherwise."""

    def __init__(self, gamma: int, max_gamma: int = 32):
        self.gamma = gamma
        self.max_gamma = max_gamma

    def next(self, rows: int = 1) -> int:
        return self.gamma

    def update(self, drafted, accepted, rejected, draft_seconds, target_seconds, rows=1) -> None:
        if drafted == 0:
            return
        self.gamma = min(self.max_gamma, self.gamma + 2) if not rejected else max(1, self.gamma - 1)


class _LinearFit:
    """Weighted least squares y = a + b * x from running sums; the slope is clamped at >= 0 (more work never
    costs less) and is 0 until two different x are seen."""

    def __init__(self) -> None:
        self.w = self.wx = self.wxx = self.wy = self.wxy = 0.0

    def add(self, x: float, y: float, weight: float = 1.0) -> None:
        self.w += weight
        self.wx += weight * x
        self.wxx += weight * x * x
        self.wy += weight * y
        self.wxy += weight * x * y

    @property
    def known(self) -> bool:
        return self.w > 0

    def __call__(self, x: float) -> float:
        mean_x, mean_y = self.wx / self.w, self.wy / self.w
        var_x = self.wxx / self.w - mean_x**2
        slope = max(0.0, (self.wxy / self.w - mean_x * mean_y) / var_x) if var_x > 1e-9 else 0.0
        return mean_y + slope * (x - mean_x)


class StepCosts:
    """Timings AutoGamma learns its costs from; a Pipeline keeps one across its calls, so the cost model is
    calibrated once per loaded pipeline and each later call (or batch) starts from it instead of from scratch.

    The first step of each shape (rows, draft length) is not recorded: it pays one-time costs (kernel selection and
    buffer allocation for a new input shape, lazy initialisation) that no later step pays, and in a cold process
    they dwarf the step itself, which used to drive gamma auto to short drafts and below plain decoding.
    A target call scores rows x (gamma + 1) tokens; its seconds are fitted as a + b * tokens, so the fit sees the
    work grow with the batch as well as with the draft (flat while the forward is memory-bound, steep once it is
    compute-bound). Drafting seconds per drafted position (one draft forward over the batch) are fitted against rows.
    """

    def __init__(self) -> None:
        self.seen_shapes: set[tuple[int, int]] = set()
        self.folded = False
        self.calls = 0  # timed steps
        self.target = _LinearFit()  # seconds of one target call ~ tokens scored
        self.draft = _LinearFit()  # seconds per drafted position ~ rows, weighted by the positions drafted

    def record(self, drafted: int, draft_seconds: float, target_seconds: float, rows: int = 1) -> None:
        if (rows, drafted) not in self.seen_shapes:
            self.seen_shapes.add((rows, drafted))
            return
        self.calls += 1
        self.target.add(rows * (drafted + 1), target_seconds)
        if drafted:
            self.draft.add(rows, draft_seconds / drafted, weight=drafted)

    @property
    def known(self) -> bool:
        return self.target.known and self.target.wy > 0

    def target_seconds(self, tokens: int) -> float:
        """Fitted seconds of one target call scoring `tokens` positions (rows x (gamma + 1))."""
        return max(self.target(tokens), 1e-12)

    def draft_seconds(self, rows: int = 1) -> float:
        """Fitted seconds of drafting one position for `rows` rows (0 when drafting is folded or never timed)."""
        if self.folded or not self.draft.known:
            return 0.0
        return max(self.draft(rows), 0.0)

    def drafting_folded(self) -> None:
        self.folded = True

    def c(self, rows: int = 1) -> float:
        """Definition 7's c for a batch of `rows`: one draft position over one plain target step, both over the rows."""
        if not self.known:
            return 0.0
        return self.draft_seconds(rows) / self.target_seconds(rows)


class AutoGamma(DraftLength):
    """Leviathan section 3.5: gamma maximising Theorem 8 for the alpha and c measured so far, for this step's rows.

    alpha is this run's accepted / judged ratio over all rows with a weak prior (alpha = 0.5 worth 2 tokens) so early
    steps explore; c is the drafter's seconds per drafted position over the target's seconds per plain step.
    Theorem 8 assumes verifying gamma + 1 tokens costs one target step; on a CPU, and on any device once a batch makes
    the forward compute-bound, it costs more, so the target's cost is fitted against the tokens a call scores
    (StepCosts) and gamma maximises E(tokens) / (gamma * c + verify_cost(rows x (gamma + 1)) / cost(rows)): with a
    flat fit this is Theorem 8 exactly. gamma 0 (plain decoding, factor 1) wins when no draft beats it, e.g. a
    large batch on a compute-bound target; a drafted step every probe_every plain ones keeps alpha measured (it would
    otherwise freeze where it was). Until a timing is known gamma stays at its start value (4, the best fixed
    length of the code-zoo benchmark for both the draft model and prompt lookup).
    """

    reads_timers = True

    def __init__(self, gamma: int = 4, max_gamma: int = 16, costs: StepCosts | None = None, probe_every: int = 8):
        self.gamma = gamma
        self.max_gamma = max_gamma
        self.probe_every = probe_every
        self.costs = costs if costs is not None else StepCosts()
        self.accepted = 1.0
        self.judged = 2.0
        self._plain_steps = 0  # consecutive steps without a draft

    @property
    def alpha(self) -> float:
        return self.accepted / self.judged

    def c(self, rows: int = 1) -> float:
        return self.costs.c(rows)

    def target_seconds(self, tokens: int) -> float:
        return self.costs.target_seconds(tokens)

    def drafting_folded(self) -> None:
        self.costs.drafting_folded()

    @property
    def folded(self) -> bool:
        return self.costs.folded

    def best(self, rows: int = 1) -> int:
        """Theorem 8's gamma in 0..max_gamma for a batch of `rows` (ties go to the shorter draft)."""
        from .theory import walltime_factor

        if not self.costs.known:
            return self.gamma
        alpha, c = min(self.alpha, 1.0 - 1e-6), self.c(rows)
        plain = self.target_seconds(rows)
        factors = {g: walltime_factor(alpha, g, c, verify_cost=self.target_seconds(rows * (g + 1)) / plain)
                   for g in range(self.max_gamma + 1)}
        return max(factors, key=lambda g: (factors[g], -g))

    def next(self, rows: int = 1) -> int:
        gamma = self.best(rows)
        if gamma:
            self._plain_steps = 0
            return gamma
        self._plain_steps += 1
        if self._plain_steps >= self.probe_every:
            self._plain_steps = 0
            return 1
        return 0

    def update(self, drafted, accepted, rejected, draft_seconds, target_seconds, rows=1) -> None:
        self.accepted += accepted
        self.judged += accepted + int(rejected)
        self.costs.record(drafted, draft_seconds, target_seconds, rows)


MAX_GAMMA = 64  # the longest fixed draft: the widest verify width the engine plans for (cached_lm.WIDTH_BUCKETS)


def parse_gamma(gamma: object, context: int | None = None) -> int | str:
    """Validate a draft length: an integer in 1..MAX_GAMMA (or its decimal string), "heuristic" or "auto" (which
    may also choose 0, no draft, step by step). The one place gamma is bounded, for the CLI, the API, the server
    and the bench: a fixed gamma above MAX_GAMMA, or one whose verify forward (the pending token + gamma drafts)
    cannot fit the target's `context` positions after a one-token prompt, is an error naming the bound, never
    clamped silently. (Within the bound, each step drafts at most the tokens the request has left.)"""
    if isinstance(gamma, str):
        if gamma in ("auto", "heuristic"):
            return gamma
        if not gamma.isdecimal():
            raise DraftVerifyError(f"gamma must be an integer >= 1, 'heuristic' or 'auto', got {gamma!r}")
        gamma = int(gamma)
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise DraftVerifyError(f"gamma (draft length) must be an integer >= 1, 'heuristic' or 'auto', got {gamma!r}")
    bound, why = MAX_GAMMA, "the longest draft one verify forward is planned for"
    if context is not None and context - 1 < bound:
        bound, why = context - 1, f"the target attends to {context} positions, one of them the prompt's"
    if gamma > bound:
        raise DraftVerifyError(f"gamma (draft length) {gamma} is above {bound}, {why}: use a gamma in 1..{bound}, "
                               "or 'auto' (picks 0..16 from the measured acceptance and costs)")
    return gamma


def make_draft_length(gamma: int | str, costs: StepCosts | None = None, context: int | None = None) -> DraftLength:
    """gamma: an integer in 1..MAX_GAMMA, "heuristic" (start at 5, as Hugging Face does) or "auto" (costs: timings to
    start from and to add to, e.g. a Pipeline's); context: the target's positions, when known (see parse_gamma)."""
    gamma = parse_gamma(gamma, context)
    if gamma == "auto":
        return AutoGamma(costs=costs)
    if gamma == "heuristic":
        return HeuristicGamma(5)
    return FixedGamma(gamma)

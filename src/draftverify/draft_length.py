"""How many tokens to draft each step: fixed gamma, Hugging Face's heuristic, Theorem 8 with measured alpha, c, or
Theorem 8's length as a cap that the drafter's own confidence ends early (ConfidenceGamma)."""

from __future__ import annotations

import bisect
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from .errors import DraftVerifyError


class DraftLength(ABC):
    reads_timers: bool = False  # the loop synchronises the device before timing a step only for policies that read it
    # drafters that draft from a model's distribution q end a draft at its first token whose max q is <= this
    # (DecodingState.draft_confidence; ConfidenceGamma); 0: never, every draft is as long as next() says
    confidence: float = 0.0

    @property
    def sizing_costs(self) -> StepCosts | None:
        """What a step costs, measured in this run, for a drafter that sizes its draft by cost (model_tree's tree):
        None where the draft length is the user's (a fixed gamma or cap)."""
        return None

    @property
    def learns(self) -> bool:
        """Whether the policy reads the steps' feedback (its class overrides update or update_rows): the loop tells
        only such a policy about each step."""
        kind = type(self)
        return kind.update is not DraftLength.update or kind.update_rows is not DraftLength.update_rows

    @abstractmethod
    def next(self, rows: int = 1) -> int:
        """gamma for the coming step of a batch of `rows` rows: >= 1, or 0 for a plain decoding step (no draft)."""

    def drafting_folded(self) -> None:
        """Told once before generation when the drafter drafts inside the target's verify forward (heads, BiTA):
        drafting then has no cost of its own, whatever the draft timer shows."""

    def update(
        self,
        drafted: int,
        accepted: int,
        rejected: int,
        draft_seconds: float | None,
        target_seconds: float | None,
        rows: int = 1,
    ) -> None:
        """Feedback after a step of `rows` rows: the target scored rows x (drafted + 1) tokens; accepted draft
        tokens and rejected (rows that stopped at a rejected draft token; a bool for one row) add up the rows. The
        seconds are None for a step whose forward also decoded the prompt (not a step's cost)."""

    def update_rows(self, lengths: list[int], accepted: list[int]) -> None:
        """The same step row by row (called after update()): each row's realised draft length (a tree: its depth)
        and its accepted draft tokens. Rows may draft fewer than next() said (a confidence stop, a short copy)."""


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

    def _var_x(self) -> float:
        return self.wxx / self.w - (self.wx / self.w) ** 2

    @property
    def varies(self) -> bool:
        """Whether two different x were seen (the slope is measured, not assumed 0)."""
        return self.w > 0 and self._var_x() > 1e-9

    def at(self, xs: Sequence[float]) -> list[float]:
        """The fit at each x, its line read once (a policy asks for every cap, every step)."""
        mean_x, mean_y = self.wx / self.w, self.wy / self.w
        slope = max(0.0, (self.wxy / self.w - mean_x * mean_y) / self._var_x()) if self.varies else 0.0
        return [mean_y + slope * (x - mean_x) for x in xs]

    def __call__(self, x: float) -> float:
        return self.at([x])[0]


def _non_decreasing(values: list[float]) -> list[float]:
    """The non-decreasing sequence nearest `values` in squares (pool adjacent violators): a width timed below a
    narrower one is pooled with it into their mean. A curve of one median per width is noisy, and more tokens are
    taken never to cost less; pooling, unlike carrying the running maximum forward, lets one slow reading lift
    only the widths around it, not every wider one."""
    blocks: list[list[float]] = []  # [mean, count] of each pooled run
    for value in values:
        blocks.append([value, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, n2), (m1, n1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    return [mean for mean, count in blocks for _ in range(int(count))]


class VerifyCost:
    """Seconds of one target call scoring n tokens (a verify pass over a pending token and n - 1 drafts).

    With a measured cost curve (seed: {tokens: seconds}, a backend's cost_curve) the curve's shape is kept: linear
    between its measured widths, along its last segment past them, and never falling as the width grows (a dip
    is pooled with the widths before it, _non_decreasing). A line
    through those points cannot price a quantized file on a CPU, where one token runs one kernel and two run another
    that costs about twice as much, while two to four cost nearly the same: the line made a one-token draft look
    cheap and plain decoding dear, so drafts that lose to plain decoding were taken. The run's own timed calls set
    the level: each call's seconds over the curve's at its width, averaged with the curve counted as `weight` calls
    per width at ratio 1 (a longer context makes every width dearer alike).
    Without a curve: one line fitted to the timed calls (_LinearFit)."""

    def __init__(self) -> None:
        self.line = _LinearFit()  # every timed call (the unseeded model)
        self.widths: list[float] = []  # the curve's tokens, ascending
        self.seconds: list[float] = []  # its seconds there, made non-decreasing
        self.ratio_sum = 0.0  # timed seconds / the curve's, summed, with the curve's own weight
        self.ratio_weight = 0.0
        # the shape at each whole number of tokens asked so far (index: tokens): a policy prices every width it
        # may draft, every step, and the shape changes only when seeded again
        self._shapes: list[float] = []
        # bumped whenever the seconds of two widths may stand in a new ratio (a seed; a timed call when no curve
        # sets the shape): what a policy derived from the ratios alone stays valid until it moves
        self.shape_version = 0

    def seed(self, curve: dict[int, float], weight: float = 1.0) -> None:
        points = sorted((float(k), float(s)) for k, s in curve.items() if k >= 1 and s > 0)
        if not points:
            return
        self.widths = [k for k, _ in points]
        self.seconds = _non_decreasing([s for _, s in points])
        self._shapes = []
        self.shape_version += 1
        self.ratio_sum = self.ratio_weight = weight * len(points)

    def add(self, tokens: float, seconds: float) -> None:
        self.line.add(tokens, seconds)
        if self.widths:  # the level moves, the curve's ratios do not
            self.ratio_sum += seconds / self._shape(tokens)
            self.ratio_weight += 1.0
        else:
            self.shape_version += 1

    @property
    def curved(self) -> bool:
        """Whether a measured curve sets the shape."""
        return bool(self.widths)

    @property
    def known(self) -> bool:
        return self.curved or (self.line.known and self.line.wy > 0)

    @property
    def varies(self) -> bool:
        """Whether the cost's growth with the width is measured (a curve of two widths or more, or timed calls of
        two different widths), not assumed flat."""
        return len(self.widths) > 1 or self.line.varies

    def _shape(self, tokens: float) -> float:
        whole = int(tokens)
        if whole == tokens and whole >= 0:
            shapes = self._shapes
            while len(shapes) <= whole:
                shapes.append(self._interpolate(len(shapes)))
            return shapes[whole]
        return self._interpolate(tokens)

    def _interpolate(self, tokens: float) -> float:
        widths, seconds = self.widths, self.seconds
        if tokens <= widths[0] or len(widths) == 1:  # below the narrowest width measured: in proportion
            return seconds[0] * tokens / widths[0] if tokens < widths[0] else seconds[0]
        i = min(bisect.bisect_left(widths, tokens), len(widths) - 1)  # the segment [i - 1, i]; the last one past it
        slope = (seconds[i] - seconds[i - 1]) / (widths[i] - widths[i - 1])
        return seconds[i - 1] + slope * (tokens - widths[i - 1])

    def at(self, tokens: Sequence[float]) -> list[float]:
        """Seconds of a call at each entry of `tokens`."""
        if not self.widths:
            return self.line.at(tokens)
        level = self.ratio_sum / self.ratio_weight
        return [level * self._shape(t) for t in tokens]

    def __call__(self, tokens: float) -> float:
        return self.at([tokens])[0]


class StepCosts:
    """Timings AutoGamma learns its costs from; a Pipeline keeps one across its calls, so the cost model is
    calibrated once per loaded pipeline and each later call (or batch) starts from it instead of from scratch.

    The first step of each shape (rows, draft length) is not recorded: it pays one-time costs (kernel selection and
    buffer allocation for a new input shape, lazy initialisation) that no later step pays, and in a cold process
    they dwarf the step itself, which used to drive gamma auto to short drafts and below plain decoding.
    A target call scores rows x (gamma + 1) tokens; its seconds follow the target's measured cost curve where the
    backend has one (VerifyCost), else a + b * tokens fitted to the timed calls, so the cost grows with the batch as
    well as with the draft (flat while the forward is memory-bound, steep once it is compute-bound). Drafting
    seconds per drafted position (one draft forward over the batch) are fitted against rows.
    """

    def __init__(self) -> None:
        self.seen_shapes: set[tuple[int, int]] = set()
        self.folded = False
        self.calls = 0  # timed steps
        self.target = VerifyCost()  # seconds of one target call ~ tokens scored
        self.seeded = False  # started from a measured cost curve (seed)
        self.draft = _LinearFit()  # seconds per drafted position ~ rows, weighted by the positions drafted

    def seed(self, curve: dict[int, float], weight: float = 1.0) -> None:
        """Start the target's fit from a measured cost curve {tokens scored: seconds of one call} (a backend's
        cost_curve, measured beside the run), each point worth `weight` timed steps: the policy then knows from
        the first step how the cost grows with the width, and the run's own timings set its level (VerifyCost)."""
        self.target.seed(curve, weight)
        self.seeded = True

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
        return self.target.known

    @property
    def slope_known(self) -> bool:
        """Whether the cost over two different numbers of tokens is known (a seeded curve, or timed calls): until
        then the fit is flat."""
        return self.target.varies

    def target_seconds(self, tokens: int) -> float:
        """Fitted seconds of one target call scoring `tokens` positions (rows x (gamma + 1))."""
        return self.target_seconds_at([tokens])[0]

    def target_seconds_at(self, tokens: list[int]) -> list[float]:
        """target_seconds for each entry of `tokens`."""
        return [max(y, 1e-12) for y in self.target.at(tokens)]

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


MIN_EVIDENCE = 64  # draft tokens judged before a learning policy may choose plain decoding
START_GAMMA = 4  # auto's and conf's length until timings are known (AutoGamma)


class AutoGamma(DraftLength):
    """Leviathan section 3.5: gamma maximising Theorem 8 for the alpha and c measured so far, for this step's rows.

    alpha is this run's accepted / judged ratio over all rows with a weak prior (alpha = 0.5 worth 2 tokens) so early
    steps explore; c is the drafter's seconds per drafted position over the target's seconds per plain step.
    Theorem 8 assumes verifying gamma + 1 tokens costs one target step; on a CPU, and on any device once a batch makes
    the forward compute-bound, it costs more, so the target's cost is fitted against the tokens a call scores
    (StepCosts) and gamma maximises E(tokens) / (gamma * c + verify_cost(rows x (gamma + 1)) / cost(rows)): with a
    flat fit this is Theorem 8 exactly. gamma 0 (plain decoding, factor 1) wins when no draft beats it, e.g. a
    large batch on a compute-bound target; a drafted step every probe_every plain ones keeps alpha measured (it would
    otherwise freeze where it was), and until min_evidence draft tokens were judged the best draft is taken instead
    (a choice of plain decoding made on the prior alone measures nothing and can hold for a whole prompt). Until a
    timing is known gamma stays at its start value (4: a fixed length that suits both the draft model and prompt
    lookup on the code zoo, so the first steps are not wasted).
    """

    reads_timers = True

    def __init__(
        self,
        gamma: int = START_GAMMA,
        max_gamma: int = 16,
        costs: StepCosts | None = None,
        probe_every: int = 8,
        min_evidence: int = MIN_EVIDENCE,
    ):
        self.gamma = gamma
        self.max_gamma = max_gamma
        self.probe_every = probe_every
        self.min_evidence = min_evidence
        self.costs = costs if costs is not None else StepCosts()
        self.accepted = 1.0
        self.judged = 2.0
        self._plain_steps = 0  # consecutive steps without a draft

    @property
    def alpha(self) -> float:
        return self.accepted / self.judged

    @property
    def evidence(self) -> float:
        """Draft tokens judged so far (the counts alone, without the prior's)."""
        return self.judged - 2.0

    @property
    def sizing_costs(self) -> StepCosts | None:
        return self.costs

    def c(self, rows: int = 1) -> float:
        return self.costs.c(rows)

    def target_seconds(self, tokens: int) -> float:
        return self.costs.target_seconds(tokens)

    def drafting_folded(self) -> None:
        self.costs.drafting_folded()

    @property
    def folded(self) -> bool:
        return self.costs.folded

    def best(self, rows: int = 1, drafting: bool = False) -> int:
        """Theorem 8's gamma in 0..max_gamma for a batch of `rows` (ties go to the shorter draft); drafting: the
        best of 1..max_gamma."""
        from .theory import walltime_factor

        if not self.costs.known:
            return self.gamma
        alpha, c = min(self.alpha, 1.0 - 1e-6), self.c(rows)
        plain = self.target_seconds(rows)
        factors = {
            g: walltime_factor(alpha, g, c, verify_cost=self.target_seconds(rows * (g + 1)) / plain)
            for g in range(int(drafting), self.max_gamma + 1)
        }
        return max(factors, key=lambda g: (factors[g], -g))

    def next(self, rows: int = 1) -> int:
        gamma = self.best(rows)
        if not gamma and self.evidence < self.min_evidence:
            # plain decoding is chosen on measured rates only, never on the priors: where a verify pass of two
            # tokens costs twice one (a quantized file on a CPU) the priors alone pick plain decoding, its steps
            # measure nothing, and a draft that pays was found only after a prompt or more of probes
            gamma = self.best(rows, drafting=True)
        if gamma:
            self._plain_steps = 0
            return gamma
        self._plain_steps += 1
        if self._plain_steps >= self.probe_every:
            self._plain_steps = 0
            return self.probe(rows)
        return 0

    def probe(self, rows: int = 1) -> int:
        """The draft length of a probe between plain steps: one token, which measures alpha."""
        return 1

    def update(self, drafted, accepted, rejected, draft_seconds, target_seconds, rows=1) -> None:
        self.accepted += accepted
        self.judged += accepted + int(rejected)
        if target_seconds is not None:
            self.costs.record(drafted, draft_seconds, target_seconds, rows)


DEFAULT_GAMMA = 4  # the one default draft length (CLI, API, server, loop): the best fixed length of the main bench
MAX_GAMMA = 64  # the longest fixed draft: the widest verify width the engine plans for (hf's WIDTH_BUCKETS)


DEFAULT_CONFIDENCE = 0.4  # `conf`'s threshold (Hugging Face's assistant_confidence_threshold; see ConfidenceGamma)


# best() keeps its last cap for up to REPRICE_EVERY calls while the rates it was priced on moved little (the
# observations added since, to goes-on and acceptance counts, are at most REPRICE_SHARE of those it was priced on)
# and the cost curve's shape stayed: then a cap's expected speed moves by about as much as one observation among
# many, and c (a draft position's seconds over a plain step's) a little each step as the timings' means do, while
# pricing every cap again costs the step more than that (right after a llama.cpp forward its caches are cold). Early
# in a run every judged draft is priced; most steps of a model-free drafter on a dear-width target judge none.
REPRICE_EVERY = 16
REPRICE_SHARE = 0.05


class _Rate:
    """Per-position success rates of draft tokens (position 1 = a draft's first token). Each position's rate is
    its own count shrunk toward the previous position's rate (worth `weight` observations; position 1 toward
    `prior`), so a position seldom reached borrows from the ones before it and a position never reached (beyond
    the cap so far) takes the deepest measured rate."""

    def __init__(self, positions: int, prior: float = 0.5, weight: float = 2.0):
        self.prior, self.weight = prior, weight
        self.hits = [0.0] * (positions + 1)  # index k: position k (index 0 unused)
        self.trials = [0.0] * (positions + 1)
        self._rates: list[float] | None = None

    def add(self, position: int, hit: bool) -> None:
        self.trials[position] += 1
        self.hits[position] += hit
        self._rates = None

    def rates(self) -> list[float]:
        """[positions + 1] the rate at each position (index 0: the prior)."""
        if self._rates is None:
            out = [self.prior]
            for hits, trials in zip(self.hits[1:], self.trials[1:]):
                out.append((hits + self.weight * out[-1]) / (trials + self.weight))
            self._rates = out
        return self._rates

    def pooled(self) -> float:
        """All positions together (with the prior): a summary for reports and tests."""
        return (sum(self.hits) + self.weight * self.prior) / (sum(self.trials) + self.weight)


class ConfidenceGamma(AutoGamma):
    """Draft while the drafter is confident, up to a cap: AutoGamma's cost model (or a fixed cap) bounds the draft
    and the drafter ends it early at its first token whose max q is <= `threshold` (BiLD's fallback rule used as a
    draft-length policy; Hugging Face's assisted generation does the same with assistant_confidence_threshold).

    Decisions, and why:
    - confidence is the max of q as the drafter draws from it (sampling.probs_from_logits): the raw softmax when
      greedy (argmax drafts, so it is the drafted token's probability, as in Hugging Face), the tempered and
      filtered distribution when sampling (what the acceptance min(1, p/q) sees). It depends on the committed text
      and the draft so far only, so the draft length is a stopping time of the draft and every exact verifier
      stays exact: only the draft length changes, never what is kept.
    - the unconfident token is still proposed (as Hugging Face does, unlike BiLD's fallback, which hands that
      position to the target): its draft forward is already paid for, and one more verified position costs little
      beside the chance it is right, which is far from zero at the default threshold.
    - the cap maximises expected tokens per unit of time over the *realised* lengths L = min(S, cap), S the
      position of the draft's first unconfident token. Three rates are measured per draft position k: the chance
      the k-th token is confident (so the draft goes on), and the acceptance of confident and of unconfident
      tokens. They are not constant: deep tokens of a draft that stayed confident are accepted more often than
      its first (such a draft is copying boilerplate), and long confident runs are far likelier than one constant
      rate predicts, so a single alpha (Theorem 8's) undervalues long caps.
      A step costs L draft positions and a target call over L + 1 tokens (StepCosts' fitted curve). In a batch
      the draft goes on while any row is confident and every row keeps the batch's length (drafters/model.py: a
      row's own stop would save no draft forward and, where rows are scored densely or in micro-batches of equal
      counts, little of the verify pass), so the rates a batch measures are its own draft's and L is the batch's
      length. A drafter that never stops early
      (prompt lookup) has continue rates 1, and with one acceptance rate at every position this is AutoGamma's
      Theorem 8 exactly.
    - the rates are this run's counts (per row, from update_rows), see _Rate for the priors; a row that drafted
      fewer than the cap counts as a confidence stop (a short copy of lookup_model or the end of max_new_tokens is
      counted so too: rare, and it only makes long caps look cheaper); the last token of a row that reached the cap
      counts as confident.
    - the rates past the cap are never measured, and one early rejection deep in a draft can hold the cap short
      for the rest of the run; so for one row, every explore_every-th drafting step the cap is max_gamma (cheap:
      the confidence stop still ends that draft), and the cap is the longest whose expected speed is within
      `slack` of the best: with the stop doing the work the expected speed is nearly flat over long caps,
      flatter than the estimates are sure, and a longer cap is what measures the deep positions. Batches do
      neither: there the longest row sets the cost, so a slack towards long caps makes every row wait for it.
    - when no cap pays (gamma 0, plain decoding), a probe every probe_every plain steps drafts up to max_gamma for
      one row (see probe()), so the rates and the cost curve go on being measured where the cap would use them.
    - until timings are known the cap is max_gamma for one row (the stop ends the drafts, as in Hugging Face's
      default behaviour, cap 20 and threshold 0.4), and AutoGamma's start value for a batch. With variable realised
      lengths StepCosts sees many shapes, each skipped once, so this start lasts longer than auto's.
    - max_gamma 32 and threshold 0.4 were tuned on the code zoo's pair, greedy, with the policy fed an idle
      machine's modelled timings, so shared-CPU noise did not pick them: a lower threshold drafts past tokens that
      are wrong, a higher one stops drafts that would have been kept.

    fixed: a fixed cap instead of the cost model's (Hugging Face: 20); gamma 0 (plain decoding) is then never
    chosen.
    """

    def __init__(
        self,
        threshold: float = DEFAULT_CONFIDENCE,
        gamma: int = START_GAMMA,
        max_gamma: int = 32,
        costs: StepCosts | None = None,
        probe_every: int = 8,
        fixed: int | None = None,
        explore_every: int = 8,
        slack: float = 0.02,
        min_evidence: int = MIN_EVIDENCE,
    ):
        super().__init__(gamma, max_gamma, costs, probe_every, min_evidence)
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 <= threshold <= 1.0:
            raise DraftVerifyError(f"the draft confidence threshold must be a number in [0, 1], got {threshold!r}")
        if fixed is not None and (isinstance(fixed, bool) or not isinstance(fixed, int) or fixed < 1):
            raise DraftVerifyError(f"a fixed cap must be an integer >= 1, got {fixed!r}")
        self.confidence = float(threshold)
        self.fixed = fixed
        positions = max(max_gamma, fixed or 0)
        self.sure = _Rate(positions)  # acceptance of confident draft tokens
        self.unsure = _Rate(positions)  # acceptance of the unconfident token a draft ended at
        self.goes_on = _Rate(positions)  # a drafted token is confident: the draft goes on after it
        self.cap = gamma  # what next() said last
        self.explore_every = explore_every
        self.slack = slack
        self._steps = 0
        self._kept_tables: tuple | None = None  # _tables' last: ((top, rows, shape version), the rates, tables)
        self._observed = 0  # rate observations so far, counted per row as drafted positions + judged ones (update_rows)
        # best()'s last: ((rows, drafting, shape version), calls left, cap, the observations it was priced on)
        self._chosen: tuple | None = None

    @property
    def sizing_costs(self) -> StepCosts | None:
        return None if self.fixed is not None else self.costs

    @property
    def alpha_confident(self) -> float:
        return self.sure.pooled()

    @property
    def alpha_unconfident(self) -> float:
        return self.unsure.pooled()

    @property
    def continue_rate(self) -> float:
        """b: the chance a drafted token is confident, so the draft goes on after it (all positions)."""
        return self.goes_on.pooled()

    def probe(self, rows: int = 1) -> int:
        """One row: as far as the confidence stop goes (max_gamma). A one-token probe would time only target calls
        over 1 and 2 tokens and measure only the first position's rates; on a backend whose cost curve is steepest
        there (llama.cpp's) the fit then extrapolates that slope, long drafts look dear, and the policy can stay in
        plain decoding for a whole run, from one early estimate made of the priors and a few timed steps. A batch
        probes one token, as auto does: there the longest row sets the cost."""
        return self.max_gamma if rows == 1 and self.fixed is None else 1

    def next(self, rows: int = 1) -> int:
        self.cap = super().next(rows)
        self._steps += 1
        if (
            rows == 1
            and self.fixed is None
            and self.explore_every
            and self.cap
            and self._steps % self.explore_every == 0
        ):
            self.cap = self.max_gamma  # explore: the rates past a short cap are never measured otherwise
        return self.cap

    @property
    def evidence(self) -> float:
        return sum(self.sure.trials) + sum(self.unsure.trials)

    def best(self, rows: int = 1, drafting: bool = False) -> int:
        if self.fixed is not None:
            return self.fixed
        if not self.costs.known:
            return self.max_gamma if rows == 1 else self.gamma
        key = (rows, drafting, self.costs.target.shape_version)
        kept = self._chosen
        if kept is not None and kept[0] == key and kept[1] and self._observed - kept[3] <= REPRICE_SHARE * kept[3]:
            self._chosen = (key, kept[1] - 1, kept[2], kept[3])
            return kept[2]
        tokens, positions, verify = self._tables(self.max_gamma, rows)
        c = self.c(rows)
        factors = [t / (c * p + v) for t, p, v in zip(tokens, positions, verify)]
        if drafting:
            factors[0] = 0.0
        near = max(factors) * (1.0 - (self.slack if rows == 1 else 0.0))
        cap = max(g for g, f in enumerate(factors) if f >= near)
        self._chosen = (key, REPRICE_EVERY, cap, self._observed)
        return cap

    def _tables(self, top: int, rows: int) -> tuple[list[float], list[float], list[float]]:
        """For caps 0..top over `rows` rows, three [top + 1] tables: the tokens one row expects to emit (accepted
        drafts + the target's), the draft positions and the verify seconds (in plain steps of those rows) a step
        expects; its time is c x positions + verify. A draft that ends at its s-th token (chance
        reach[s] - reach[s + 1], reach[s] the chance its first s - 1 tokens were confident) drafts s positions and
        is verified over rows x (s + 1) tokens.

        Made in one pass, and again only when a rate changed (_Rate.rates makes a new list then), the cost curve's
        shape moved (VerifyCost.shape_version: its level cancels in the ratios) or top or rows differ: a step that
        judged no draft (the suffix cache found no match) reuses them, and most steps of a model-free drafter on a
        dear-width target are such steps."""
        a, lo, b = self.sure.rates(), self.unsure.rates(), self.goes_on.rates()
        key = (top, rows, self.costs.target.shape_version)
        kept = self._kept_tables
        if kept is not None and kept[0] == key and kept[1][0] is a and kept[1][1] is lo and kept[1][2] is b:
            return kept[2]
        widths = [rows * (g + 1) for g in range(top + 1)]
        verify = self.costs.target_seconds_at(widths) if self.costs.known else [1.0] * len(widths)  # unknown: flat
        plain = verify[0]  # a call over the rows' one token each
        tokens, positions, seconds = [1.0], [0.0], [1.0]
        reach = 1.0  # the chance the draft reaches position g
        ended = 0.0  # the drafts that end before the cap: sum over s of P(end at s) * E(tokens | end at s)
        prefix, whole = 1.0, 1.0  # expected tokens from a draft's first g - 1 tokens (+ the target's); P(all kept)
        done_positions = done_seconds = 0.0  # the same sums of the steps' draft positions and verify seconds
        for g in range(1, top + 1):
            on = b[g]  # at the cap, the last token is confident with this chance
            past = reach * on  # the chance the draft would go on past position g
            ratio = verify[g] / plain
            tokens.append(ended + reach * (prefix + whole * (on * a[g] + (1.0 - on) * lo[g])))
            positions.append(done_positions + reach * g)
            seconds.append(done_seconds + reach * ratio)
            stop = reach - past  # the draft ends at its g-th token, unconfident
            ended += stop * (prefix + whole * lo[g])
            done_positions += stop * g
            done_seconds += stop * ratio
            whole *= a[g]
            prefix += whole
            reach = past
        tables = (tokens, positions, seconds)
        self._kept_tables = (key, (a, lo, b), tables)
        return tables

    def expected_tokens(self, cap: int) -> float:
        """Expected tokens one row emits in a step with this cap (accepted drafts + the target's token)."""
        return self._tables(cap, 1)[0][cap]

    def expected_seconds(self, cap: int, rows: int = 1) -> float:
        """Expected time of a step with this cap over `rows` rows, in units of a plain step of those rows."""
        if cap == 0:
            return 1.0
        _, positions, verify = self._tables(cap, rows)
        return self.c(rows) * positions[cap] + verify[cap]

    def factor(self, cap: int, rows: int = 1) -> float:
        """Expected speed over plain decoding for this cap (1 at cap 0)."""
        return 1.0 if cap == 0 else self.expected_tokens(cap) / self.expected_seconds(cap, rows)

    def update_rows(self, lengths: list[int], accepted: list[int]) -> None:
        top = len(self.sure.trials) - 1
        for length, kept in zip(lengths, accepted):
            self._observed += min(length, top) + min(length, kept + 1, top)  # goes-on counts, then judged tokens
            ended_early = length < self.cap
            for k in range(1, min(length, top) + 1):
                judged = k <= kept + 1
                if k == length and ended_early:  # the unconfident token the draft ended at
                    self.goes_on.add(k, False)
                    if judged:
                        self.unsure.add(k, kept >= k)
                    continue
                if k < length:
                    self.goes_on.add(k, True)
                if judged:
                    self.sure.add(k, kept >= k)


class KeptPolicies:
    """The learning policies (auto, conf) of one pipeline or bench row, made once per (gamma, key) and kept, so
    each call starts from what the earlier calls measured: the timings and the acceptance and confidence rates. A
    policy made fresh for each call started every prompt from its priors, and conf then capped the prompt's first
    drafts short, for fewer tokens per call.
    key: what the rates depend on besides the gamma (the temperature). Fixed and heuristic lengths are made fresh
    each time (nothing measured; the heuristic restarts each call, as Hugging Face's rows do). costs: one StepCosts
    shared by every kept policy (a Pipeline's), or None: each its own."""

    def __init__(
        self,
        costs: StepCosts | None = None,
        context: int | None = None,
        cost_curve: Callable[[], dict[int, float]] | None = None,
        longest: int | None = None,
    ):
        self.costs = costs
        self.context = context
        self.longest = longest  # the drafter's Drafter.longest_draft (see make_draft_length)
        self.cost_curve = cost_curve  # the target's measured curve, read when the first timing policy is made
        self._kept: dict[tuple[str, object], DraftLength] = {}

    def get(self, gamma: int | str | DraftLength, key: object = None) -> DraftLength:
        if isinstance(gamma, DraftLength):
            return gamma  # the caller's own policy, as it is
        policy = self._kept.get((str(gamma), key))
        if policy is None:
            policy = make_draft_length(gamma, self.costs, self.context, self.longest)
            if policy.reads_timers:  # a policy that times steps starts from the target's measured curve
                if self.costs is not None and not self.costs.seeded and self.cost_curve is not None:
                    self.costs.seed(self.cost_curve())
                self._kept[(str(gamma), key)] = policy
        return policy


def parse_gamma(gamma: object, context: int | None = None) -> int | str:
    """Validate a draft length: an integer in 1..MAX_GAMMA (or its decimal string), "heuristic", "auto" (which may
    also choose 0, no draft, step by step) or "conf" / "conf=T" (auto's length as a cap, drafts ending early at a
    token whose confidence is <= T, default DEFAULT_CONFIDENCE). The one place gamma is bounded, for the CLI, the
    API, the server and the bench: a fixed gamma above MAX_GAMMA, or one whose verify forward (the pending token +
    gamma drafts) cannot fit the target's `context` positions after a one-token prompt, is an error naming the
    bound, never clamped silently. (Within the bound, each step drafts at most the tokens the request has left.)"""
    if isinstance(gamma, str):
        if gamma in ("auto", "heuristic", "conf"):
            return gamma
        if gamma.startswith("conf="):
            _confidence(gamma)
            return gamma
        if not gamma.isdecimal():
            raise DraftVerifyError(f"gamma must be an integer >= 1, 'heuristic', 'auto' or 'conf[=T]', got {gamma!r}")
        gamma = int(gamma)
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise DraftVerifyError(
            f"gamma (draft length) must be an integer >= 1, 'heuristic', 'auto' or 'conf[=T]', got {gamma!r}"
        )
    bound, why = MAX_GAMMA, "the longest draft one verify forward is planned for"
    if context is not None and context - 1 < bound:
        bound, why = context - 1, f"the target attends to {context} positions, one of them the prompt's"
    if gamma > bound:
        raise DraftVerifyError(
            f"gamma (draft length) {gamma} is above {bound}, {why}: use a gamma in 1..{bound}, "
            "or 'auto' (picks its length, 0 included, from the measured acceptance and costs)"
        )
    return gamma


def _confidence(spec: str) -> float:
    """T of "conf=T": a number in [0, 1]."""
    text = spec.removeprefix("conf=")
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 <= value <= 1.0:
        raise DraftVerifyError(
            f"gamma {spec!r}: the confidence threshold T of 'conf=T' must be a number in [0, 1], got {text!r}"
        )
    return value


def make_draft_length(
    gamma: int | str, costs: StepCosts | None = None, context: int | None = None, longest: int | None = None
) -> DraftLength:
    """gamma: an integer in 1..MAX_GAMMA, "heuristic" (start at 5, as Hugging Face does), "auto" or "conf[=T]" (costs:
    timings to start from and to add to, e.g. a Pipeline's); context: the target's positions, when known (see
    parse_gamma); longest: the drafter's Drafter.longest_draft, the bound of auto's and conf's lengths instead of
    their own (at most MAX_GAMMA and what the context holds after a one-token prompt; a fixed gamma is the
    user's and keeps its value)."""
    gamma = parse_gamma(gamma, context)
    bound: dict[str, int] = {}
    if longest is not None:
        if isinstance(longest, bool) or not isinstance(longest, int) or longest < 1:
            raise DraftVerifyError(f"a drafter's longest draft must be an integer >= 1, got {longest!r}")
        top = min(longest, MAX_GAMMA, context - 1 if context is not None else MAX_GAMMA)
        bound = {"max_gamma": top, "gamma": min(START_GAMMA, top)}
    if gamma == "auto":
        return AutoGamma(costs=costs, **bound)
    if gamma == "conf":
        return ConfidenceGamma(costs=costs, **bound)
    if isinstance(gamma, str) and gamma.startswith("conf="):
        return ConfidenceGamma(_confidence(gamma), costs=costs, **bound)
    if gamma == "heuristic":
        return HeuristicGamma(5)
    assert isinstance(gamma, int)  # parse_gamma returns an int or one of the names above
    return FixedGamma(gamma)

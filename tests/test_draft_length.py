"""Draft-length policies: fixed gamma, Hugging Face's heuristic schedule, and AutoGamma (Leviathan section 3.5)."""

from __future__ import annotations

import random
from typing import Callable

import pytest

from draftverify.draft_length import (
    AutoGamma,
    ConfidenceGamma,
    DraftLength,
    FixedGamma,
    HeuristicGamma,
    KeptPolicies,
    StepCosts,
    VerifyCost,
    make_draft_length,
    parse_gamma,
)
from draftverify.errors import DraftVerifyError
from draftverify.theory import optimal_gamma

# ---------------------------------------------------------------- FixedGamma


def test_fixed_gamma_ignores_feedback():
    policy = FixedGamma(3)
    assert policy.next() == 3
    for drafted, accepted, rejected in [(3, 3, False), (3, 0, True), (0, 0, False), (3, 1, True)]:
        policy.update(drafted, accepted, rejected, 0.01, 0.1)
        assert policy.next() == 3


# ---------------------------------------------------------------- HeuristicGamma


def test_heuristic_plus_two_on_full_acceptance():
    policy = HeuristicGamma(5)
    assert policy.next() == 5
    policy.update(5, 5, False, 0.0, 0.0)
    assert policy.next() == 7
    policy.update(7, 7, False, 0.0, 0.0)
    assert policy.next() == 9


def test_heuristic_minus_one_on_rejection_with_floor():
    policy = HeuristicGamma(3)
    policy.update(3, 1, True, 0.0, 0.0)
    assert policy.next() == 2
    policy.update(2, 0, True, 0.0, 0.0)
    assert policy.next() == 1
    policy.update(1, 0, True, 0.0, 0.0)
    assert policy.next() == 1  # floor
    policy.update(1, 1, False, 0.0, 0.0)
    assert policy.next() == 3


def test_heuristic_cap():
    policy = HeuristicGamma(29, max_gamma=32)
    policy.update(29, 29, False, 0.0, 0.0)
    assert policy.next() == 31
    policy.update(31, 31, False, 0.0, 0.0)
    assert policy.next() == 32
    policy.update(32, 32, False, 0.0, 0.0)
    assert policy.next() == 32
    policy.update(32, 3, True, 0.0, 0.0)
    assert policy.next() == 31


def test_heuristic_empty_draft_changes_nothing():
    """A drafter that proposed nothing (fallback, no prompt-lookup match) says nothing about gamma."""
    policy = HeuristicGamma(4)
    policy.update(0, 0, False, 0.0, 0.0)
    assert policy.next() == 4


# ---------------------------------------------------------------- AutoGamma


def simulate(policy: DraftLength, alpha: float, c: float, steps: int, seed: int = 0, target_seconds: float = 0.02):
    """Feed `steps` steps where each drafted token is accepted with probability alpha (until the first rejection)
    and drafting one token costs c target calls. Returns every gamma the policy chose."""
    rng = random.Random(seed)
    chosen = []
    for _ in range(steps):
        gamma = policy.next()
        chosen.append(gamma)
        accepted = 0
        while accepted < gamma and rng.random() < alpha:
            accepted += 1
        policy.update(gamma, accepted, accepted < gamma, gamma * c * target_seconds, target_seconds)
    return chosen


# (alpha, c) whose optimal gamma is the same for every alpha within +-0.03, so estimation noise cannot flip it
@pytest.mark.parametrize(
    "alpha, c, expected", [(0.6, 0.03, 5), (0.5, 0.1, 2), (0.8, 0.3, 3), (0.7, 0.1, 4), (0.9, 0.02, 16)]
)
def test_auto_gamma_converges_to_theory_optimum(alpha, c, expected):
    assert optimal_gamma(alpha, c, max_gamma=16).gamma == expected  # the parameters mean what the test says
    policy = AutoGamma()
    chosen = simulate(policy, alpha, c, steps=1500)
    assert policy.alpha == pytest.approx(alpha, abs=0.03)
    assert policy.c() == pytest.approx(c, rel=1e-9)
    assert policy.next() == expected
    assert chosen[-200:] == [expected] * 200  # settled, not oscillating


def test_auto_gamma_drafts_nothing_when_speculation_does_not_pay():
    """alpha <= c: theory says do not speculate (gamma 0, Theorem 8's factor 1); the policy decodes plainly, with
    a one-token draft every probe_every steps so alpha stays measured."""
    assert optimal_gamma(0.2, 0.5).gamma == 0
    policy = AutoGamma()
    chosen = simulate(policy, alpha=0.2, c=0.5, steps=400)
    assert policy.best() == 0
    tail = chosen[-160:]
    assert set(tail) == {0, 1} and tail.count(1) == len(tail) // policy.probe_every


def test_auto_gamma_drafts_nothing_with_no_acceptance():
    policy = AutoGamma(gamma=3, min_evidence=8)
    chosen = []
    for _ in range(50):
        gamma = policy.next()
        chosen.append(gamma)
        policy.update(gamma, 0, gamma > 0, gamma * 0.9, 1.0)
    tail = chosen[-2 * policy.probe_every :]
    assert policy.best() == 0 and set(tail) == {0, 1} and tail.count(1) == 2  # plain steps, and the probes


def test_auto_gamma_free_drafter_drafts_max_gamma():
    """c = 0 (model-free drafter, zero drafting time): the factor grows with gamma, so gamma hits max_gamma."""
    policy = AutoGamma(gamma=4, max_gamma=12)
    for _ in range(2):  # the first step at a length is not timed (cold): the second one is
        policy.update(4, 2, True, 0.0, 0.05)
    assert policy.c() == 0.0
    assert policy.next() == 12


def test_auto_gamma_ignores_the_cold_first_step_at_each_length():
    """A cold first call (one-time kernel selection, allocation) is 20x slower; counting it would make the
    target look expensive at 5 scored tokens and push gamma to the shortest draft."""
    policy = AutoGamma(gamma=4, max_gamma=12)
    policy.update(4, 4, False, 4 * 0.001, 1.0)  # cold: 1 s instead of 0.05 s
    assert policy.next() == 4 and not policy.costs.known  # nothing timed yet: stays at the start value
    policy.update(4, 4, False, 4 * 0.001, 0.05)
    assert policy.target_seconds(5) == pytest.approx(0.05)
    assert policy.c() == pytest.approx(0.001 / 0.05)
    assert policy.next() == optimal_gamma(policy.alpha, policy.c(), max_gamma=12).gamma > 4


def test_auto_gamma_costs_carry_over_to_the_next_call():
    costs = StepCosts()
    first = AutoGamma(costs=costs)
    for _ in range(3):
        first.update(4, 2, True, 4 * 0.002, 0.05)
    second = AutoGamma(costs=costs)  # a later call of the same pipeline: no cold step to relearn
    assert second.alpha == 0.5  # acceptance is the new prompt's own
    second.update(4, 4, False, 4 * 0.002, 0.05)
    assert costs.calls == 3 and second.c() == pytest.approx(0.04)
    assert second.next() != 4


def test_auto_gamma_prior_and_empty_drafts():
    policy = AutoGamma()
    assert policy.next() == 4 and policy.alpha == 0.5 and policy.c() == 0.0
    policy.update(0, 0, False, 0.0, 0.05)  # fallback: nothing drafted, nothing judged
    assert policy.alpha == 0.5 and policy.c() == 0.0
    assert policy.next() == 4  # and nothing timed yet (a first step is cold): the start value stands


def test_auto_gamma_alpha_counts_only_judged_tokens():
    """Drafts after a rejection are never judged: accepted / (accepted + rejections), not accepted / drafted."""
    policy = AutoGamma()
    policy.update(8, 2, True, 0.0, 1.0)  # 3 judged (2 accepted + the rejected one), 5 never judged
    assert policy.alpha == pytest.approx((1 + 2) / (2 + 3))


def test_auto_gamma_full_acceptance_is_finite():
    policy = AutoGamma(max_gamma=10)
    chosen = simulate(policy, alpha=1.0, c=0.05, steps=50)
    assert min(chosen) >= 1 and max(chosen) <= 10
    assert policy.next() == 10


# ---------------------------------------------------------------- make_draft_length


@pytest.mark.parametrize("value, gamma", [(1, 1), (5, 5), (64, 64), ("1", 1), ("7", 7), ("12", 12)])
def test_make_fixed(value, gamma):
    policy = make_draft_length(value)
    assert isinstance(policy, FixedGamma)
    assert policy.next() == gamma


def test_make_heuristic_starts_at_five():
    policy = make_draft_length("heuristic")
    assert isinstance(policy, HeuristicGamma)
    assert policy.next() == 5


def test_make_auto_starts_at_four_and_uses_the_given_costs():
    costs = StepCosts()
    policy = make_draft_length("auto", costs)
    assert isinstance(policy, AutoGamma)
    assert policy.next() == 4
    assert policy.costs is costs
    assert make_draft_length("auto").costs is not costs


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, False, "fast", "0", "-1", "2.5", "", " 3", "Auto", None, [3]])
def test_make_rejects(bad):
    with pytest.raises(DraftVerifyError, match="gamma"):
        make_draft_length(bad)


@pytest.mark.parametrize(
    "gamma, context, bound", [(65, None, 64), ("1000", None, 64), (1000, 2048, 64), (16, 16, 15), (9, 8, 7)]
)
def test_a_gamma_beyond_the_cap_or_the_context_is_an_error_naming_the_bound(gamma, context, bound):
    with pytest.raises(DraftVerifyError, match=rf"gamma \(draft length\) {gamma} is above {bound}\b"):
        make_draft_length(gamma, context=context)
    assert make_draft_length(bound, context=context).next() == bound
    assert isinstance(make_draft_length("auto", context=context), AutoGamma)


@pytest.mark.parametrize("gamma", ["auto", "conf", "conf=0.9"])
@pytest.mark.parametrize("longest, context, top", [(64, None, 64), (48, 2048, 48), (64, 40, 39), (2, None, 2)])
def test_a_drafters_longest_draft_bounds_the_learning_policies(gamma, longest, context, top):
    policy = make_draft_length(gamma, context=context, longest=longest)
    assert policy.max_gamma == top
    assert policy.next() <= top  # before any timing, too (its start length is within the bound)
    kept = KeptPolicies(StepCosts(), context, longest=longest)
    assert kept.get(gamma).max_gamma == top


def test_without_a_drafters_longest_draft_the_policies_keep_their_own_bounds():
    assert make_draft_length("auto").max_gamma == 16
    assert make_draft_length("conf").max_gamma == 32
    assert make_draft_length("conf", longest=None).next() == 32  # one row, timings unknown: as far as the stop goes


@pytest.mark.parametrize("gamma", [3, "heuristic"])
def test_a_drafters_longest_draft_leaves_the_users_lengths_alone(gamma):
    assert make_draft_length(gamma, longest=64).next() == make_draft_length(gamma).next()


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "64"])
def test_a_bad_longest_draft_is_an_error(bad):
    with pytest.raises(DraftVerifyError, match="longest draft"):
        make_draft_length("conf", longest=bad)


def test_make_rejects_non_decimal_digit_strings():
    with pytest.raises(DraftVerifyError):
        make_draft_length("²")


def test_auto_gamma_accounts_for_verification_cost_growing_with_draft_length():
    """On a CPU a target call over gamma + 1 tokens costs more than one over 1 token; the policy fits that cost
    (seconds = a + b * tokens) and picks the gamma maximising E(tokens) / (gamma c + verify_cost), which is
    shorter than Theorem 8's (which assumes verification is free)."""
    alpha, c, a, b = 0.8, 0.1, 0.010, 0.002  # single-token call 12 ms, each extra scored token +2 ms
    from draftverify.theory import expected_tokens_per_call

    def factor(g):
        return expected_tokens_per_call(alpha, g) / (g * c + (a + b * (g + 1)) / (a + b))

    brute = max(range(1, 17), key=lambda g: (factor(g), -g))
    plain = optimal_gamma(alpha, c, max_gamma=16).gamma
    assert brute < plain  # the two models disagree, so the test can tell them apart
    policy = AutoGamma()
    rng = random.Random(0)
    for _ in range(1500):
        gamma = policy.next()
        accepted = 0
        while accepted < gamma and rng.random() < alpha:
            accepted += 1
        target = a + b * (gamma + 1)
        policy.update(gamma, accepted, accepted < gamma, gamma * c * (a + b), target)
    assert policy.target_seconds(1) == pytest.approx(a + b, rel=1e-6)
    assert policy.c() == pytest.approx(c, rel=1e-6)
    assert policy.next() == brute


# ---------------------------------------------------------------- AutoGamma in a batch


def simulate_batch(policy: AutoGamma, alpha: float, target_cost, draft_cost, rows_schedule: list[int], seed: int = 0):
    """Steps over batches of rows_schedule[i] rows: every row accepts its own drafts with probability alpha; a
    target call costs target_cost(tokens scored = rows x (gamma + 1)) seconds and each drafted position
    draft_cost(rows). Returns (rows, gamma) of every step."""
    rng = random.Random(seed)
    steps = []
    for rows in rows_schedule:
        gamma = policy.next(rows)
        steps.append((rows, gamma))
        accepted = rejected = 0
        for _ in range(rows):
            n = 0
            while n < gamma and rng.random() < alpha:
                n += 1
            accepted += n
            rejected += n < gamma
        policy.update(gamma, accepted, rejected, gamma * draft_cost(rows), target_cost(rows * (gamma + 1)), rows)
    return steps


ROWS = [1, 2, 4, 8, 16, 32, 64]


def brute_force_gamma(alpha: float, target_cost, draft_cost, rows: int, max_gamma: int = 16) -> int:
    from draftverify.theory import expected_tokens_per_call

    plain = target_cost(rows)

    def factor(g):  # tokens per second relative to plain decoding of the same rows
        return expected_tokens_per_call(alpha, g) * plain / (g * draft_cost(rows) + target_cost(rows * (g + 1)))

    return max(range(max_gamma + 1), key=lambda g: (factor(g), -g))


def test_auto_gamma_shrinks_as_rows_grow_and_stops_drafting_when_verification_is_compute_bound():
    """A verify cost that grows steeply with the tokens a call scores (the compute-bound regime): each extra row
    multiplies the cost of a long draft, so the best gamma falls with the batch size and reaches 0 (plain
    decoding) for large batches. The policy fits that cost from steps at changing batch sizes (rows join and
    leave) and picks, for each size, the gamma brute force picks from the true costs."""
    alpha = 0.8
    target_cost = lambda tokens: 0.020 + 0.002 * tokens  # noqa: E731  seconds of one target call
    draft_cost = lambda rows: 0.0004 + 0.00002 * rows  # noqa: E731  seconds of one draft position
    schedule = [r for _ in range(40) for r in ROWS for _ in range(6)]  # rows change every 6 steps
    policy = AutoGamma()
    steps = simulate_batch(policy, alpha, target_cost, draft_cost, schedule)
    assert policy.alpha == pytest.approx(alpha, abs=0.03)
    assert policy.target_seconds(8 * 5) == pytest.approx(target_cost(8 * 5), rel=1e-6)  # the fit is the cost
    assert policy.c(8) == pytest.approx(draft_cost(8) / target_cost(8), rel=1e-6)
    best = [policy.best(r) for r in ROWS]
    assert best == [brute_force_gamma(policy.alpha, target_cost, draft_cost, r) for r in ROWS]
    assert best == sorted(best, reverse=True) and best[0] >= 4 and best[-1] == 0
    assert len(set(best)) >= 4  # shrinks step by step, not from high straight to 0
    late = steps[len(steps) // 2 :]
    assert {g for r, g in late if r == 64} <= {0, 1}  # plain steps, and one-token probes
    assert min(g for r, g in late if r == 1) >= best[0] - 1  # alpha's noise may flip a near tie, no more


def test_auto_gamma_stays_high_at_every_batch_size_when_verification_is_flat():
    """A memory-bound target (the cost of a call does not depend on the tokens it scores): drafting is as cheap at
    64 rows as at 1, so gamma stays long for every batch size."""
    alpha = 0.8
    target_cost = lambda tokens: 0.020  # noqa: E731
    draft_cost = lambda rows: 0.0004  # noqa: E731
    schedule = [r for _ in range(20) for r in ROWS for _ in range(6)]
    policy = AutoGamma()
    simulate_batch(policy, alpha, target_cost, draft_cost, schedule)
    best = [policy.best(r) for r in ROWS]
    assert best == [brute_force_gamma(policy.alpha, target_cost, draft_cost, r) for r in ROWS]
    assert len(set(best)) == 1 and best[0] >= 10


def test_step_costs_skip_the_first_step_of_each_batch_shape():
    """A new number of rows is a new input shape: its first step is cold and not timed, like a new draft length."""
    costs = StepCosts()
    costs.record(4, 0.0, 0.05, rows=1)
    costs.record(4, 0.0, 0.05, rows=1)
    costs.record(4, 0.0, 5.0, rows=2)  # cold: a new shape
    assert costs.calls == 1 and costs.target_seconds(10) == pytest.approx(0.05)
    costs.record(4, 0.0, 0.07, rows=2)
    assert costs.calls == 2 and costs.target_seconds(10) == pytest.approx(0.07)  # fitted a + b * tokens: 5 -> 10


def test_auto_gamma_hears_the_batch_totals():
    """alpha counts every row's judged tokens: 3 rows with 2, 0 and 4 of 4 drafts accepted judge 3 + 1 + 4."""
    policy = AutoGamma()
    policy.update(4, 6, 2, 0.0, 1.0, rows=3)
    assert policy.alpha == pytest.approx((1 + 6) / (2 + 8))


# ---------------------------------------------------------------- ConfidenceGamma (gamma conf)


def confidence_step(
    policy: ConfidenceGamma,
    rng: random.Random,
    b: float,
    a_sure: float,
    a_unsure: float,
    draft_seconds: float,
    target_seconds: Callable[[int], float],
) -> tuple[int, int]:
    """One step: each drafted token is confident with probability b (the drafter ends the draft at the first
    unconfident one, that token included); confident tokens are accepted with a_sure, unconfident ones with
    a_unsure, until the first rejection. draft_seconds per drafted token, target_seconds(tokens scored) per call.
    Feeds the policy; returns (the cap it chose, the realised draft length)."""
    cap = policy.next()
    sure = []
    while len(sure) < cap:
        sure.append(rng.random() < b)
        if not sure[-1]:
            break
    accepted = 0
    while accepted < len(sure) and rng.random() < (a_sure if sure[accepted] else a_unsure):
        accepted += 1
    length = len(sure)
    policy.update(length, accepted, accepted < length, length * draft_seconds, target_seconds(length + 1))
    policy.update_rows([length], [accepted])
    return cap, length


def simulate_confidence(
    policy: ConfidenceGamma,
    b: float,
    a_sure: float,
    a_unsure: float,
    c: float,
    steps: int,
    seed: int = 0,
    target_seconds: float = 0.02,
) -> list[int]:
    """confidence_step `steps` times on a flat cost (drafting one token costs c target calls). Returns each step's
    realised draft length."""
    rng = random.Random(seed)
    return [
        confidence_step(policy, rng, b, a_sure, a_unsure, c * target_seconds, lambda n: target_seconds)[1]
        for _ in range(steps)
    ]


def test_confidence_estimates_split_confident_and_unconfident_tokens():
    policy = ConfidenceGamma(0.4, fixed=20)
    realised = simulate_confidence(policy, b=0.7, a_sure=0.9, a_unsure=0.4, c=0.1, steps=4000)
    assert policy.continue_rate == pytest.approx(0.7, abs=0.02)
    assert policy.alpha_confident == pytest.approx(0.9, abs=0.02)
    assert policy.alpha_unconfident == pytest.approx(0.4, abs=0.03)
    assert sum(realised) / len(realised) == pytest.approx(1 / 0.3, rel=0.05)  # geometric lengths, far below the cap
    assert set(policy.next() for _ in range(3)) == {20}  # a fixed cap, whatever was measured


def concave_seconds(n: int) -> float:
    """A target call over n tokens on llama.cpp's kind of curve: steepest from 1 to 2 tokens (about 1.4x), 3.5x
    at 16 (benchmarks/speed/bench-humaneval-llamacpp.md)."""
    return 0.004 + 0.0015 * (n - 1) ** 0.7


def run_after_a_bad_start(policy: ConfidenceGamma, seed: int = 0) -> list[int]:
    """30 steps of a poor draft (the policy learns that no cap pays), then 600 of a good one, on the concave
    curve; returns the caps of the good phase."""
    rng = random.Random(seed)
    for _ in range(30):
        confidence_step(policy, rng, 0.5, 0.1, 0.05, 0.0003, concave_seconds)
    return [confidence_step(policy, rng, 0.9, 0.95, 0.5, 0.0003, concave_seconds)[0] for _ in range(600)]


def test_confidence_probes_from_plain_decoding_reach_the_cap_and_find_the_drafts_again(monkeypatch):
    """Once no cap pays, conf decodes plainly with a probe every probe_every steps; its probes draft up to
    max_gamma (the stop ends them), so a draft that got good is found again within a few probes. One-token probes
    (auto's) time only 1- and 2-token calls, whose steep slope the fit extrapolates, and measure only the first
    position: the same runs stay plain three to four times as long (the wrong rule, shown)."""
    plain_steps = {}
    for rule in ("to the cap", "one token"):
        if rule == "one token":
            monkeypatch.setattr(ConfidenceGamma, "probe", lambda self, rows=1: 1)
        # plain decoding allowed from the first judged token (min_evidence 0): the probes are what is tested here
        runs = [run_after_a_bad_start(ConfidenceGamma(0.4, min_evidence=0), seed) for seed in range(5)]
        plain_steps[rule] = sum(caps.count(0) for caps in runs)
        if rule == "to the cap":
            for caps in runs:
                assert set(c for c in caps[:16] if c) == {32}  # plain steps, and probes to the cap
                assert caps[-200:].count(0) == 0 and sum(caps[-200:]) / 200 > 4  # drafting again
    assert plain_steps["to the cap"] < 300 and plain_steps["one token"] > 2 * plain_steps["to the cap"], plain_steps
    monkeypatch.undo()
    assert ConfidenceGamma(0.4).probe(rows=2) == 1 and ConfidenceGamma(0.4, fixed=5).probe() == 1


def test_confidence_update_rows_counts_each_position_by_hand():
    policy = ConfidenceGamma(0.4, fixed=10)
    policy.next()
    # row 0 ended early at its 3rd token, all accepted; row 1 reached the cap (10) and kept 4; row 2 ended early
    # at its 5th token but its 2nd (confident) token was rejected, so its unconfident last one was never judged;
    # row 3 drafted nothing
    policy.update_rows([3, 10, 5, 0], [3, 4, 1, 0])
    counts = lambda rate: list(zip(rate.hits[1:11], rate.trials[1:11]))  # noqa: E731
    assert counts(policy.sure) == [(3, 3), (2, 3), (1, 1), (1, 1), (0, 1)] + [(0, 0)] * 5
    assert counts(policy.unsure) == [(0, 0), (0, 0), (1, 1)] + [(0, 0)] * 7
    # went on past position k: rows 0 (k = 1, 2), 1 (k = 1..9), 2 (k = 1..4); ended at k: row 0 at 3, row 2 at 5
    assert counts(policy.goes_on) == [(3, 3), (3, 3), (2, 3), (2, 2), (1, 2)] + [(1, 1)] * 4 + [(0, 0)]


def test_confidence_rates_are_per_position_and_borrow_from_the_position_before():
    """A draft's first tokens are accepted less often than its deep ones (on code, a draft that stayed confident
    long is copying boilerplate); each position's rate is measured, and positions never reached take the deepest
    measured rate."""
    policy = ConfidenceGamma(0.4, fixed=12)
    rng = random.Random(0)
    for _ in range(3000):
        cap = policy.next()
        length = next((k for k in range(1, cap) if rng.random() > 0.8), cap)  # ends at k with chance 0.2 each
        kept = 0
        while kept < length and rng.random() < (0.85 if kept == 0 else 0.98):
            kept += 1
        policy.update_rows([length], [kept])
    sure = policy.sure.rates()
    assert sure[1] == pytest.approx(0.85, abs=0.03) and sure[4] == pytest.approx(0.98, abs=0.02)
    assert policy.goes_on.rates()[2] == pytest.approx(0.8, abs=0.03)
    assert policy.sure.trials[20] == 0 and sure[20] == sure[12]  # never reached: the deepest measured rate


def set_rates(policy: ConfidenceGamma, sure: float, unsure: float, goes_on: float, n: float = 1e12) -> None:
    """Every position measured n times at these rates (the priors then weigh nothing)."""
    for rate, value in ((policy.sure, sure), (policy.unsure, unsure), (policy.goes_on, goes_on)):
        rate.trials = [0.0] + [n] * (len(rate.trials) - 1)
        rate.hits = [0.0] + [value * n] * (len(rate.hits) - 1)
        rate._rates = None


def timed(policy: DraftLength, c: float = 0.1, steps: int = 3) -> None:
    """Timings of c = 0.1 and flat verification."""
    for _ in range(steps):
        policy.update(2, 1, True, 2 * c * 0.02, 0.02)


def test_confidence_without_early_stops_is_theorem_8():
    """Continue rates 1 (the drafter never ends a draft early, e.g. prompt lookup) and one acceptance rate: the
    expected tokens and speed are AutoGamma's, Theorem 8 with the measured verification cost."""
    from draftverify.theory import expected_tokens_per_call, walltime_factor

    policy = ConfidenceGamma(0.4, slack=0.0)
    simulate(policy, alpha=0.8, c=0.1, steps=200)
    set_rates(policy, sure=0.8, unsure=0.3, goes_on=1.0)
    for g in (1, 4, 9):
        assert policy.expected_tokens(g) == pytest.approx(expected_tokens_per_call(0.8, g))
        verify = policy.target_seconds(g + 1) / policy.target_seconds(1)
        assert policy.factor(g) == pytest.approx(walltime_factor(0.8, g, policy.c(), verify))
    auto = AutoGamma()
    auto.costs, auto.accepted, auto.judged = policy.costs, 0.8e12, 1e12
    assert policy.best() == auto.best()


def test_confidence_decides_from_tables_kept_between_steps_as_from_fresh_ones(monkeypatch):
    """The tables a step without a draft reuses (no rate changed) and those made again after a judged draft give
    the cap a policy that makes every table afresh gives, step after step (priced every step here)."""
    monkeypatch.setattr("draftverify.draft_length.REPRICE_EVERY", 0)
    rng = random.Random(7)
    kept, fresh = ConfidenceGamma(max_gamma=48), ConfidenceGamma(max_gamma=48)
    for policy in (kept, fresh):
        policy.costs.seed({1: 0.004, 2: 0.0052, 4: 0.0071, 8: 0.0102, 16: 0.0163, 32: 0.031, 64: 0.06})
    for _ in range(300):
        fresh._kept_tables = fresh._chosen = None
        cap = kept.next()
        assert cap == fresh.next()
        length = rng.choice([0, 0, 0, rng.randint(1, max(cap, 1))])  # most steps: no draft, nothing judged
        accepted = rng.randint(0, length)
        seconds = 0.004 * (1 + 0.2 * length) * rng.uniform(0.9, 1.1)
        for policy in (kept, fresh):
            policy.update_rows([length], [accepted])
            policy.update(length, accepted, accepted < length, 1e-5 * length, seconds)


def test_confidence_keeps_its_cap_while_its_rates_move_little_and_prices_it_again_after(monkeypatch):
    """The last cap is reused for up to REPRICE_EVERY calls while the observations added to the rates since its
    pricing stay within REPRICE_SHARE of those it was priced on (only c moved, or the rates by a few observations
    among many); more observations, a new curve or the end of that run price the caps again, and a pricing gives
    the cap a fresh policy gives."""
    from draftverify.draft_length import REPRICE_EVERY, REPRICE_SHARE

    policy = ConfidenceGamma(max_gamma=32, explore_every=0)
    policy.costs.seed({1: 0.004, 2: 0.0052, 4: 0.0071, 8: 0.0102, 16: 0.0163, 32: 0.031})
    simulate_confidence(policy, b=0.9, a_sure=0.9, a_unsure=0.4, c=0.05, steps=100)
    priced = []
    real_c = policy.c
    monkeypatch.setattr(policy, "c", lambda rows=1: priced.append(rows) or real_c(rows))  # read once per pricing

    def fresh_cap() -> int:
        twin = ConfidenceGamma(max_gamma=32, explore_every=0)
        twin.costs, twin.sure, twin.unsure, twin.goes_on = policy.costs, policy.sure, policy.unsure, policy.goes_on
        return twin.best()

    policy._chosen = None
    assert policy.best() == fresh_cap() and len(priced) == 1
    for call in range(1, REPRICE_EVERY + 2):  # nothing judged: the cap is kept, then priced again
        policy.update_rows([0], [0])
        policy.best()
        assert len(priced) == 1 + (call > REPRICE_EVERY)
    observed, kept_cap = policy._observed, policy.best()
    assert observed > 100  # a hundred steps of drafts: one more is a small share of what was priced
    policy.update_rows([2], [1])  # a judged draft of two tokens: a few observations
    assert policy.best() == kept_cap and len(priced) == 2
    while policy._observed - observed <= REPRICE_SHARE * observed:  # the rates move by more than the share
        policy.update_rows([4], [4])
    assert policy.best() == fresh_cap() and len(priced) == 3
    before = policy.best()
    policy.costs.seed({1: 0.004, 2: 0.008, 4: 0.016, 8: 0.032, 16: 0.064, 32: 0.128})  # width dear, same rates
    assert policy.best() == fresh_cap() and len(priced) == 4
    assert policy.best() < before


def test_confidence_prices_every_judged_draft_early_in_a_run():
    """With few observations every judged draft moves the rates by more than the share: each is priced."""
    policy = ConfidenceGamma(max_gamma=16, explore_every=0)
    policy.costs.seed({1: 0.004, 2: 0.0052, 4: 0.0071, 8: 0.0102, 16: 0.0163})
    priced = []
    real_c = policy.c
    policy.c = lambda rows=1: priced.append(rows) or real_c(rows)
    for step in range(5):
        policy.best()
        assert len(priced) == step + 1
        policy.update_rows([3], [2])


def test_a_seeded_curve_priced_again_is_the_new_curves():
    cost = VerifyCost()
    cost.seed({1: 1.0, 8: 8.0})
    assert cost.at([4, 4.5]) == pytest.approx([4.0, 4.5])
    cost.seed({1: 1.0, 8: 1.0})  # a flat curve replaces it: no width keeps the old price
    assert cost.at([4, 4.5, 20]) == pytest.approx([1.0, 1.0, 1.0])


def test_confidence_expected_tokens_by_hand():
    policy = ConfidenceGamma(0.4)
    set_rates(policy, sure=0.9, unsure=0.5, goes_on=0.6)
    # cap 2: the draft ends at token 1 (chance 0.4; it is unconfident: 1 + 0.5) or reaches token 2 (0.6; token 1
    # confident, token 2 confident with chance 0.6: 1 + 0.9 + 0.9 * (0.6 * 0.9 + 0.4 * 0.5))
    assert policy.expected_tokens(2) == pytest.approx(0.4 * 1.5 + 0.6 * (1 + 0.9 + 0.9 * (0.54 + 0.2)))
    assert policy.expected_tokens(0) == 1.0


def test_confidence_drafts_stopping_early_make_a_long_cap_cheap():
    """When drafts usually end early on their own, a long cap is rarely reached, so it costs little: with the
    same acceptance and costs, the cap is longer than auto's gamma."""
    auto, conf = AutoGamma(), ConfidenceGamma(0.4)
    timed(auto)
    timed(conf)
    auto.accepted, auto.judged = 0.8e12, 1e12
    set_rates(conf, sure=0.8, unsure=0.8, goes_on=0.5)
    assert auto.best() == optimal_gamma(0.8, 0.1, max_gamma=16).gamma
    assert conf.best() > auto.best()


def test_confidence_a_step_of_a_batch_costs_its_drafts_length_in_every_row():
    policy = ConfidenceGamma(0.4)
    timed(policy)
    set_rates(policy, sure=0.9, unsure=0.5, goes_on=0.5)
    c = policy.c(2)
    assert c == pytest.approx(0.1)
    # the draft's length is 1 with chance 1/2, else 2 (a batch's rates are its draft's, every row that long): one
    # row scores 1 + length tokens, two rows twice as many (the fitted call is flat here: 1 plain step either way)
    assert policy.expected_seconds(2, rows=1) == pytest.approx(0.5 * (c + 1) + 0.5 * (2 * c + 1))
    verify = [policy.target_seconds(2 * (g + 1)) / policy.target_seconds(2) for g in (1, 2)]
    assert policy.expected_seconds(2, rows=2) == pytest.approx(0.5 * (c + verify[0]) + 0.5 * (2 * c + verify[1]))
    assert policy.expected_seconds(0) == 1.0 and policy.factor(0) == 1.0


def test_confidence_takes_the_longest_cap_within_the_slack_of_the_best_for_one_row_only():
    policy = ConfidenceGamma(0.4)
    timed(policy)
    set_rates(policy, sure=0.9, unsure=0.5, goes_on=0.7)
    factors = [policy.factor(g) for g in range(policy.max_gamma + 1)]
    strict = factors.index(max(factors))
    assert policy.slack == 0.02 and policy.best() == max(g for g, f in enumerate(factors) if f >= 0.98 * max(factors))
    assert policy.best() > strict  # the curve is flat over long caps: the slack reaches further
    rows = [policy.factor(g, rows=4) for g in range(policy.max_gamma + 1)]
    assert policy.best(4) == rows.index(max(rows))  # a batch takes the best cap itself


def test_confidence_explores_the_longest_cap_every_few_steps_for_one_row_only():
    policy = ConfidenceGamma(0.4, explore_every=4)
    timed(policy)
    set_rates(policy, sure=0.6, unsure=0.3, goes_on=1.0)  # poor acceptance: a short cap
    short = policy.best()
    assert 0 < short < policy.max_gamma
    assert [policy.next() for _ in range(8)] == [short] * 3 + [32] + [short] * 3 + [32]
    assert set(policy.next(rows=4) for _ in range(8)) == {policy.best(4)}
    fixed = ConfidenceGamma(0.4, fixed=5, explore_every=4)
    assert {fixed.next() for _ in range(8)} == {5}


def test_confidence_starts_long_for_one_row_and_at_autos_start_for_a_batch():
    policy = ConfidenceGamma(0.4)
    assert policy.next(1) == policy.max_gamma == 32
    assert policy.next(4) == 4
    assert policy.confidence == 0.4


def test_make_conf_with_and_without_a_threshold():
    costs = StepCosts()
    policy = make_draft_length("conf", costs)
    assert isinstance(policy, ConfidenceGamma) and policy.confidence == 0.4 and policy.costs is costs
    assert make_draft_length("conf=0.25").confidence == 0.25
    assert make_draft_length("conf=0").confidence == 0.0
    assert parse_gamma("conf=0.25") == "conf=0.25" and parse_gamma("conf") == "conf"
    assert make_draft_length("auto").confidence == 0.0 and make_draft_length(4).confidence == 0.0


@pytest.mark.parametrize(
    "bad", ["conf=1.5", "conf=-0.1", "conf=", "conf=x", "conf=nan", "conf=inf", "Conf", "confidence", "conf 0.4"]
)
def test_make_rejects_bad_conf(bad):
    with pytest.raises(DraftVerifyError, match="gamma|conf"):
        make_draft_length(bad)


@pytest.mark.parametrize(
    "kwargs", [{"threshold": 1.5}, {"threshold": -0.1}, {"threshold": True}, {"fixed": 0}, {"fixed": 2.0}]
)
def test_confidence_gamma_rejects_bad_settings(kwargs):
    with pytest.raises(DraftVerifyError):
        ConfidenceGamma(**kwargs)


def test_a_seeded_cost_curve_sizes_drafts_from_the_first_step():
    """A measured curve (a backend's cost_curve) gives the policies the cost's growth before any step is timed:
    where a wide pass is nearly free auto drafts long at once, where it costs as much as its tokens it drafts
    short or not at all."""
    cheap = {1: 0.010, 2: 0.0105, 4: 0.0148, 8: 0.020, 16: 0.0316, 32: 0.0529}  # an f32 file on this CPU's shape
    dear = {k: 0.004 * k for k in cheap}  # every token costs as much as one decode
    sizes = {}
    for name, curve in (("cheap", cheap), ("dear", dear)):
        costs = StepCosts()
        costs.seed(curve)
        assert costs.seeded and costs.known and costs.slope_known
        policy = AutoGamma(costs=costs)
        for _ in range(30):  # drafts of 8, half of each kept, drafting free: alpha 0.5 measured, no step timed
            policy.update(8, 4, True, None, None)
        sizes[name] = policy.next()
    assert sizes["cheap"] > sizes["dear"]
    assert sizes["dear"] <= 1


def test_kept_policies_seed_the_costs_once_and_only_for_a_timing_policy():
    calls = []

    def curve():
        calls.append(1)
        return {1: 0.01, 2: 0.011, 4: 0.015}

    costs = StepCosts()
    kept = KeptPolicies(costs, cost_curve=curve)
    kept.get(4)
    kept.get("heuristic")
    assert calls == [] and not costs.seeded  # fixed lengths read no timing: nothing measured
    kept.get("auto")
    kept.get("conf=0.5")
    kept.get("conf")
    assert calls == [1] and costs.seeded and costs.target_seconds(1) > 0


@pytest.mark.parametrize("gamma,learns", [(4, False), ("heuristic", True), ("auto", True), ("conf", True)])
def test_a_policy_learns_when_it_reads_the_steps_feedback(gamma, learns):
    # the loop tells only a learning policy about each step: one that reads feedback must say it learns
    assert make_draft_length(gamma).learns is learns


def test_a_policy_of_ones_own_that_reads_feedback_learns():
    class RowsOnly(FixedGamma):
        def update_rows(self, lengths, accepted):
            self.seen = accepted

    class Plain(FixedGamma):
        pass

    assert RowsOnly(3).learns and not Plain(3).learns


# a q8_0 file on a two-core CPU, as measured: a second token runs another kernel and costs about twice the first,
# while two to four tokens cost nearly the same
KINKED = {1: 0.0207, 2: 0.0430, 4: 0.0546, 8: 0.0999, 16: 0.1665, 32: 0.2211}


def test_a_seeded_verify_cost_is_the_measured_curve_between_and_past_its_widths():
    cost = VerifyCost()
    cost.seed(KINKED)
    assert cost.known and cost.varies and cost.curved
    for tokens, seconds in KINKED.items():
        assert cost(tokens) == pytest.approx(seconds)
    assert cost(3) == pytest.approx((0.0430 + 0.0546) / 2)  # linear between two measured widths
    assert cost(40) == pytest.approx(0.2211 + 8 * (0.2211 - 0.1665) / 16)  # the last segment's slope past them
    assert cost(0.5) == pytest.approx(0.0207 / 2)


def test_a_dip_in_the_measured_curve_is_pooled_with_the_widths_before_it():
    cost = VerifyCost()
    cost.seed({1: 0.010, 2: 0.0148, 4: 0.0142, 8: 0.018})  # an f32 file: four tokens timed below two
    assert cost(2) == pytest.approx(0.0145) and cost(3) == pytest.approx(0.0145) and cost(4) == pytest.approx(0.0145)
    assert all(cost(a) <= cost(b) for a, b in zip(range(1, 12), range(2, 13)))


def test_one_slow_reading_lifts_only_the_widths_around_it():
    """A width timed slow (noise at load) is pooled with the next ones until the curve rises again; the running
    maximum would have priced every wider width at least as dear."""
    cost = VerifyCost()
    cost.seed({1: 1.0, 2: 5.0, 3: 2.0, 4: 3.0, 5: 4.0, 6: 6.0})
    assert [cost(k) for k in range(1, 7)] == pytest.approx([1.0, 10 / 3, 10 / 3, 10 / 3, 4.0, 6.0])


def test_the_runs_timed_calls_scale_the_curve_and_keep_its_shape():
    cost = VerifyCost()
    cost.seed(KINKED, weight=1.0)
    for _ in range(60):  # a longer context: every call takes 1.5x the curve's time at its width
        cost.add(5, 1.5 * cost._shape(5))
    level = (len(KINKED) + 60 * 1.5) / (len(KINKED) + 60)
    for tokens in (1, 2, 5, 16):
        assert cost(tokens) == pytest.approx(level * VerifyCost._shape(cost, tokens))
    assert cost(2) / cost(1) == pytest.approx(0.0430 / 0.0207)  # the kink stays where it was measured


def test_without_a_curve_the_verify_cost_is_a_line_through_the_timed_calls():
    cost = VerifyCost()
    assert not cost.known and not cost.varies
    cost.add(1, 0.010)
    assert cost.known and not cost.varies and cost(8) == pytest.approx(0.010)  # one width: flat
    cost.add(9, 0.018)
    assert cost.varies and cost(5) == pytest.approx(0.014)


@pytest.mark.parametrize("alpha,plain", [(0.6, True), (0.8, True), (0.95, False)])
def test_auto_decodes_plainly_where_the_measured_curve_says_no_draft_pays(alpha, plain):
    """On the kinked curve a one-token draft costs a two-token pass, twice a plain step: at alpha 0.6 or 0.8 no
    length earns more than plain decoding (a line through the same points priced the two-token pass at 1.2x a
    plain step and drafted); at 0.95 a draft does."""
    costs = StepCosts()
    costs.seed(KINKED)
    costs.draft.add(1, 0.0025)  # a draft forward: an eighth of a plain step
    policy = AutoGamma(costs=costs)
    policy.accepted, policy.judged = alpha * 1000, 1000.0
    assert (policy.best() == 0) is plain


def test_auto_drafts_until_its_rates_are_measured_before_it_decodes_plainly():
    """On the kinked curve the prior alone (alpha 0.5) says no draft pays; plain decoding chosen then would measure
    nothing, so the policy drafts until min_evidence draft tokens were judged, and goes plain only if they say so."""
    costs = StepCosts()
    costs.seed(KINKED)
    policy = AutoGamma(costs=costs, min_evidence=10)
    assert policy.best() == 0 and policy.next() >= 1
    policy.update(2, 0, True, None, None)
    for _ in range(9):
        policy.update(1, 0, True, None, None)
    assert policy.evidence == 10 and policy.next() == 0  # measured: nothing is kept


def test_conf_counts_its_judged_draft_tokens_as_evidence():
    policy = ConfidenceGamma()
    assert policy.evidence == 0
    policy.cap = 8
    policy.update_rows([3], [1])  # two draft tokens judged: the first kept, the second not
    assert policy.evidence == 2

"""Distribution tests that define the exactness of speculative sampling (Leviathan et al., Algorithm 1, A.1, A.5).

The verifier is called directly with hand-made logits over a vocabulary of 8 tokens. A batch of B independent
rows plays the role of B independent runs: every row has the same target logits and drafter distribution q, the
draft tokens are drawn from q, and the emitted tokens are tallied. Since the hand-made logits do not depend on
the prefix, the target's own sampling emits p_j at position j independently of earlier tokens, so for every j
the token emitted at position j (among rows that got that far, i.e. num_accepted >= j) must be distributed as
p_j. This covers the first emitted token (j = 0), later tokens given acceptance of earlier ones, and the bonus
token (j = N).

A Pearson chi-square test with an exact p-value (regularised upper incomplete gamma) is used; the sample size
is large enough that the same check rejects deliberately wrong rules with p-values many orders of magnitude
below the threshold (see the `wrong rule` tests), while a correct rule fails with probability < 1e-6 per check.
"""

from __future__ import annotations

import math

import pytest
import torch

from draftverify.errors import DraftVerifyError
from draftverify.sampling import probs_from_logits, residual, sample
from draftverify.theory import acceptance_rate, lenient_acceptance_rate
from draftverify.types import Draft, SamplingParams
from draftverify.verifiers import GreedyVerifier, SpeculativeSamplingVerifier, rejection as rejection_module
from draftverify.verifiers.base import accepted_prefix_length, gather_at, make_verdict

torch.set_num_threads(1)

V = 8
B = 40_000
P_THRESHOLD = 1e-6  # a correct rule fails one check with probability 1e-6

# target logits for positions 0..3 (position N is the bonus position)
TARGET_LOGITS = torch.tensor(
    [
        [2.0, 1.2, 0.9, 0.3, 0.0, -0.4, -1.0, -1.6],
        [-0.5, 1.5, 0.2, 1.0, -1.2, 0.6, 0.1, -0.3],
        [0.3, -0.7, 1.1, -0.2, 1.8, 0.0, -1.5, 0.7],
        [1.0, 0.0, -1.0, 0.5, -0.5, 1.5, 0.2, -0.2],
    ],
    dtype=torch.float64,
)
# drafter distributions: deliberately different from p (they favour what the target dislikes), full support,
# so drafts include tokens that top-k / top-p filter out of p.
DRAFT_Q = 0.6 * (-0.7 * TARGET_LOGITS).softmax(-1) + 0.4 / V

PARAMS = {
    "t0.7": SamplingParams(temperature=0.7),
    "t1.3": SamplingParams(temperature=1.3),
    "topk3": SamplingParams(temperature=1.0, top_k=3),
    "topp0.8": SamplingParams(temperature=1.0, top_p=0.8),
    "t0.9_topk5_topp0.9": SamplingParams(temperature=0.9, top_k=5, top_p=0.9),
}


# ----------------------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------------------


def reference_p(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Target distribution after temperature -> top-k -> top-p, computed independently (float64). logits [..., V]."""
    out = []
    for row in logits.reshape(-1, logits.shape[-1]).double():
        z = row / params.temperature
        order = torch.argsort(z, descending=True).tolist()
        if params.top_k:
            order = order[: params.top_k]
        w = torch.softmax(z[order], -1).tolist()
        kept, mass = [], 0.0
        for i, wi in zip(order, w):
            kept.append(i)
            mass += wi
            if mass >= params.top_p:
                break
        masked = torch.full_like(z, float("-inf"))
        masked[kept] = z[kept]
        out.append(masked.softmax(-1))
    return torch.stack(out).reshape(logits.shape)


def chi2_pvalue(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square goodness of fit of 1-D token samples to probs [V]. Returns 0 on any impossible token.

    Categories with expected count < 10 are pooled so the chi-square approximation holds.
    """
    n = tokens.numel()
    assert n > 0
    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    probs = probs.double()
    if counts[probs == 0].sum() > 0:
        return 0.0
    expected = n * probs
    big = expected >= 10
    obs = torch.cat([counts[big], counts[~big & (probs > 0)].sum()[None]])
    exp = torch.cat([expected[big], expected[~big & (probs > 0)].sum()[None]])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    df = obs.numel() - 1
    if df == 0:
        return 1.0
    stat = float(((obs - exp) ** 2 / exp).sum())
    return float(
        torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64))
    )


def draw_drafts(q: torch.Tensor, batch: int, gen: torch.Generator) -> torch.Tensor:
    """q [N, V] -> draft tokens [batch, N] with column i drawn from q[i]."""
    if q.shape[0] == 0:
        return torch.zeros(batch, 0, dtype=torch.long)
    return torch.multinomial(q.float(), batch, replacement=True, generator=gen).T.contiguous()


def run(
    verifier,
    n: int,
    params: SamplingParams,
    seed: int,
    q: torch.Tensor | None = None,
    logits: torch.Tensor = TARGET_LOGITS,
    batch: int = B,
    fixed_draft: list[int] | None = None,
):
    """One batched verify call. Returns (draft tokens [B, N], verdict)."""
    gen = torch.Generator().manual_seed(seed)
    if fixed_draft is not None:
        x = torch.tensor(fixed_draft, dtype=torch.long)[None].expand(batch, n).contiguous()
        q_probs = None
    else:
        q = DRAFT_Q[:n] if q is None else q
        x = draw_drafts(q, batch, gen)
        q_probs = q.float()[None].expand(batch, n, V)
    target = logits[: n + 1][None].expand(batch, n + 1, V)
    verdict = verifier.verify(Draft(tokens=x, q_probs=q_probs), target, params, gen)
    return x, verdict


def check_structure(x: torch.Tensor, verdict, exact_residual: bool = True) -> None:
    batch, n = x.shape
    assert verdict.tokens.shape == (batch, n + 1)
    assert verdict.num_accepted.shape == (batch,)
    acc = verdict.num_accepted
    assert ((acc >= 0) & (acc <= n)).all()
    pos = torch.arange(n + 1)[None]
    prefix = pos < acc[:, None]
    padded_x = torch.cat([x, torch.full((batch, 1), -1)], 1)
    assert torch.equal(verdict.tokens[prefix], padded_x[prefix])  # the accepted prefix is the draft's
    emitted = gather_at(verdict.tokens, acc)
    assert ((emitted >= 0) & (emitted < V)).all()
    assert (verdict.tokens[pos > acc[:, None]] == -1).all()  # -1 padding after the emitted token
    if exact_residual:
        # a rejected draft token x has l*q(x) > p(x), so the residual max(0, p - l*q) is 0 there: never re-emitted
        rejected = acc < n
        if rejected.any():
            assert (emitted[rejected] != gather_at(padded_x, acc)[rejected]).all()


def position_pvalues(verdict, p: torch.Tensor, min_rows: int = 500) -> list[tuple[int, int, float]]:
    """For every position j: (j, rows reaching j, p-value of the emitted token at j against p[j])."""
    out = []
    n = verdict.tokens.shape[1] - 1
    for j in range(n + 1):
        rows = verdict.num_accepted >= j
        if int(rows.sum()) < min_rows:
            continue
        out.append((j, int(rows.sum()), chi2_pvalue(verdict.tokens[rows, j], p[j])))
    return out


# ----------------------------------------------------------------------------------------------------------
# the chi-square check itself: sane on exact samples, powerful against wrong distributions
# ----------------------------------------------------------------------------------------------------------


def test_chi2_check_accepts_exact_samples_and_rejects_shifted_ones():
    gen = torch.Generator().manual_seed(0)
    p = reference_p(TARGET_LOGITS[0], SamplingParams(temperature=1.0))
    draws = sample(p.float().expand(B, V), gen)
    assert chi2_pvalue(draws, p) > P_THRESHOLD
    shifted = p.clone()
    shifted[0] -= 0.02
    shifted[7] += 0.02  # total variation 0.02
    assert chi2_pvalue(draws, shifted) < P_THRESHOLD
    impossible = p.clone()
    impossible[int(draws[0])] = 0.0
    assert chi2_pvalue(draws, impossible / impossible.sum()) == 0.0


# ----------------------------------------------------------------------------------------------------------
# exactness: every emitted position follows the target's p
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("name", list(PARAMS))
def test_emitted_tokens_follow_target_distribution(name, n):
    params = PARAMS[name]
    p = reference_p(TARGET_LOGITS, params)
    x, verdict = run(SpeculativeSamplingVerifier(), n, params, seed=1000 + 10 * n + list(PARAMS).index(name))
    check_structure(x, verdict)
    results = position_pvalues(verdict, p)
    assert results[0][0] == 0 and results[0][1] == B  # the first emitted token: all rows
    assert any(j >= 1 for j, _, _ in results)  # and at least one later position given acceptance
    for j, rows, pval in results:
        assert pval > P_THRESHOLD, f"position {j} ({rows} rows): p-value {pval:.3g}"


@pytest.mark.parametrize("name", ["t1.3", "topk3", "topp0.8"])
def test_acceptance_rate_is_sum_min_p_q(name):
    """Theorem 5: P(accept x_1) = sum_x min(p(x), q(x)) for the filtered p."""
    params = PARAMS[name]
    p = reference_p(TARGET_LOGITS[0], params)
    _, verdict = run(SpeculativeSamplingVerifier(), 1, params, seed=77)
    beta = float(acceptance_rate(p, DRAFT_Q[0]))
    rate = float((verdict.num_accepted == 1).double().mean())
    assert abs(rate - beta) < 5 * math.sqrt(beta * (1 - beta) / B)


def test_filtered_out_draft_tokens_are_always_rejected():
    params = PARAMS["topk3"]
    p = reference_p(TARGET_LOGITS, params)
    x, verdict = run(SpeculativeSamplingVerifier(), 3, params, seed=5)
    for j in range(3):
        reached = verdict.num_accepted >= j
        outside = reached & (p[j][x[:, j]] == 0)
        assert outside.sum() > 1000
        assert (verdict.num_accepted[outside] == j).all()


def test_heterogeneous_batch_rows_are_independent():
    """Rows with different (p, q) in one batch: each subset follows its own p (guards batch indexing)."""
    params = SamplingParams(temperature=1.0)
    half = B // 2
    logits_a, logits_b = TARGET_LOGITS[:3], TARGET_LOGITS.flip(-1)[:3] * 1.5
    q_a, q_b = DRAFT_Q[:2], DRAFT_Q.flip(0)[:2]
    gen = torch.Generator().manual_seed(9)
    x = torch.cat([draw_drafts(q_a, half, gen), draw_drafts(q_b, half, gen)])
    idx = torch.arange(B) % 2  # interleave rows a and b
    order = torch.argsort(idx, stable=True)
    x_il = torch.empty_like(x)
    x_il[order] = x
    logits = torch.where((idx == 0)[:, None, None], logits_a[None], logits_b[None])
    q = torch.where((idx == 0)[:, None, None], q_a[None], q_b[None]).float()
    verdict = SpeculativeSamplingVerifier().verify(Draft(tokens=x_il, q_probs=q), logits, params, gen)
    check_structure(x_il, verdict)
    for which, lg in ((0, logits_a), (1, logits_b)):
        rows = idx == which
        p = reference_p(lg, params)
        sub = type(verdict)(
            tokens=verdict.tokens[rows], num_accepted=verdict.num_accepted[rows], path=verdict.path[rows]
        )
        for j, cnt, pval in position_pvalues(sub, p):
            assert pval > P_THRESHOLD, (which, j, cnt, pval)


def test_seeded_generator_makes_verification_reproducible():
    params = PARAMS["t1.3"]
    _, a = run(SpeculativeSamplingVerifier(), 3, params, seed=42, batch=2000)
    _, b = run(SpeculativeSamplingVerifier(), 3, params, seed=42, batch=2000)
    _, c = run(SpeculativeSamplingVerifier(), 3, params, seed=43, batch=2000)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.num_accepted, b.num_accepted)
    assert not torch.equal(a.tokens, c.tokens)


def test_q_probs_dtype_float64_is_accepted():
    params = PARAMS["t0.7"]
    p = reference_p(TARGET_LOGITS, params)
    gen = torch.Generator().manual_seed(3)
    x = draw_drafts(DRAFT_Q[:2], B, gen)
    verdict = SpeculativeSamplingVerifier().verify(
        Draft(tokens=x, q_probs=DRAFT_Q[:2][None].expand(B, 2, V)), TARGET_LOGITS[:3][None].expand(B, 3, V), params, gen
    )
    check_structure(x, verdict)
    for j, _, pval in position_pvalues(verdict, p):
        assert pval > P_THRESHOLD


# ----------------------------------------------------------------------------------------------------------
# deliberately wrong rules: the same check must reject them
# ----------------------------------------------------------------------------------------------------------


def _wrong_ratio_verify(draft: Draft, target_logits, params, generator):
    """Speculative sampling with the acceptance ratio inverted: accept with probability min(1, q/p)."""
    x = draft.tokens
    p = probs_from_logits(target_logits, params)
    q = draft.q_probs.float()
    p_x = p[:, : x.shape[1]].gather(-1, x[..., None]).squeeze(-1)
    q_x = q.gather(-1, x[..., None]).squeeze(-1)
    r = torch.rand(x.shape, generator=generator)
    n = accepted_prefix_length(r * p_x < q_x)
    q_padded = torch.cat([q, torch.zeros_like(p[:, :1])], dim=1)
    return make_verdict(x, n, sample(residual(gather_at(p, n), gather_at(q_padded, n)), generator))


class _WrongRatioVerifier:
    verify = staticmethod(_wrong_ratio_verify)


@pytest.mark.parametrize("name", ["t1.3", "topk3", "topp0.8"])
def test_wrong_rule_correction_from_p_instead_of_residual_is_rejected(name, monkeypatch):
    """Sampling the correction from p (not norm(max(0, p - q))) gives min(p, q) + (1 - beta) p != p."""
    params = PARAMS[name]
    p = reference_p(TARGET_LOGITS, params)
    monkeypatch.setattr(rejection_module, "residual", lambda p_, q_: p_)
    _, verdict = run(SpeculativeSamplingVerifier(), 1, params, seed=11)
    beta = torch.minimum(p[0], DRAFT_Q[0]).sum()
    wrong = torch.minimum(p[0], DRAFT_Q[0]) + (1 - beta) * p[0]
    assert 0.5 * (wrong - p[0]).abs().sum() > 0.05  # the wrong rule really is wrong here
    assert chi2_pvalue(verdict.tokens[:, 0], wrong) > P_THRESHOLD  # it produces what theory says ...
    assert chi2_pvalue(verdict.tokens[:, 0], p[0]) < P_THRESHOLD  # ... and the exactness check rejects it


@pytest.mark.parametrize("name", ["t0.7", "t1.3", "topp0.8"])
def test_wrong_rule_accept_with_q_over_p_is_rejected(name):
    params = PARAMS[name]
    p = reference_p(TARGET_LOGITS, params)
    _, verdict = run(_WrongRatioVerifier(), 2, params, seed=12)
    pvals = [pval for _, _, pval in position_pvalues(verdict, p)]
    assert pvals[0] < P_THRESHOLD


def test_wrong_rule_bonus_from_wrong_position_is_rejected(monkeypatch):
    """If the bonus token were drawn from p at position N instead of N + 1, the per-position check catches it."""
    params = PARAMS["t1.3"]
    p = reference_p(TARGET_LOGITS, params)
    real_gather = rejection_module.gather_at

    def off_by_one(values, index):
        return real_gather(values, (index - (index == values.shape[1] - 1).long()).clamp_min(0))

    monkeypatch.setattr(rejection_module, "gather_at", off_by_one)
    _, verdict = run(SpeculativeSamplingVerifier(), 1, params, seed=13)
    results = dict((j, pval) for j, _, pval in position_pvalues(verdict, p))
    assert results[1] < P_THRESHOLD


# ----------------------------------------------------------------------------------------------------------
# deterministic drafts (q_probs None: q is one-hot at the proposed token)
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,draft",
    [("t1.3", [1, 3, 4]), ("t0.7", [0, 0, 0]), ("topk3", [5, 1, 2]), ("topp0.8", [1, 7, 4])],
)
def test_deterministic_drafts_are_exact(name, draft):
    params = PARAMS[name]
    p = reference_p(TARGET_LOGITS, params)
    x, verdict = run(SpeculativeSamplingVerifier(), 3, params, seed=21, fixed_draft=draft)
    check_structure(x, verdict)
    # acceptance of the first token has probability p(x_1)
    rate = float((verdict.num_accepted >= 1).double().mean())
    p_x = float(p[0, draft[0]])
    assert abs(rate - p_x) <= 5 * math.sqrt(max(p_x * (1 - p_x), 1e-12) / B) + 1e-12
    for j, rows, pval in position_pvalues(verdict, p, min_rows=300):
        assert pval > P_THRESHOLD, (j, rows, pval)


def test_deterministic_draft_outside_support_is_always_rejected():
    params = PARAMS["topk3"]
    p = reference_p(TARGET_LOGITS, params)
    assert p[0, 7] == 0
    x, verdict = run(SpeculativeSamplingVerifier(), 2, params, seed=22, fixed_draft=[7, 1])
    assert (verdict.num_accepted == 0).all()
    assert chi2_pvalue(verdict.tokens[:, 0], p[0]) > P_THRESHOLD


# ----------------------------------------------------------------------------------------------------------
# all accepted: the bonus token comes from p at position N + 1
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("name", ["t0.7", "topk3", "t0.9_topk5_topp0.9"])
def test_all_accepted_when_q_equals_p_and_bonus_follows_p_next(name, n):
    params = PARAMS[name]
    p = reference_p(TARGET_LOGITS, params)
    q = probs_from_logits(TARGET_LOGITS[:n], params)  # exactly the verifier's own p
    x, verdict = run(SpeculativeSamplingVerifier(), n, params, seed=31 + n, q=q)
    check_structure(x, verdict)
    assert (verdict.num_accepted == n).all()
    assert torch.equal(verdict.tokens[:, :n], x)
    assert chi2_pvalue(verdict.tokens[:, n], p[n]) > P_THRESHOLD
    # the bonus position uses p_{N+1}, not p_N: for these logits the two differ enough to be told apart
    assert chi2_pvalue(verdict.tokens[:, n], p[n - 1]) < P_THRESHOLD


def test_empty_draft_emits_one_token_from_p():
    params = PARAMS["t1.3"]
    p = reference_p(TARGET_LOGITS, params)
    gen = torch.Generator().manual_seed(4)
    x = torch.zeros(B, 0, dtype=torch.long)
    verdict = SpeculativeSamplingVerifier().verify(
        Draft(tokens=x, q_probs=torch.zeros(B, 0, V)), TARGET_LOGITS[:1][None].expand(B, 1, V), params, gen
    )
    assert verdict.tokens.shape == (B, 1)
    assert (verdict.num_accepted == 0).all()
    assert chi2_pvalue(verdict.tokens[:, 0], p[0]) > P_THRESHOLD


# ----------------------------------------------------------------------------------------------------------
# lenience (Appendix A.5)
# ----------------------------------------------------------------------------------------------------------

# p and q for the lenience tests: q over-weights tokens 4..7 so l*q > p there for small l
LENIENT_LOGITS = TARGET_LOGITS[:2]
LENIENT_Q = torch.tensor(
    [[0.05, 0.05, 0.10, 0.10, 0.15, 0.15, 0.20, 0.20], [0.10, 0.10, 0.10, 0.10, 0.15, 0.15, 0.15, 0.15]],
    dtype=torch.float64,
)


def lenient_output(p: torch.Tensor, q: torch.Tensor, l: float) -> torch.Tensor:
    """Exact output distribution of the lenient rule: min(q, p/l) + (1 - alpha) * norm(max(0, p - l q))."""
    alpha = torch.minimum(q, p / l).sum()
    res = (p - l * q).clamp_min(0)
    return torch.minimum(q, p / l) + (1 - alpha) * res / res.sum()


@pytest.mark.parametrize("lenience", [0.8, 0.5, 0.2])
@pytest.mark.parametrize("name", ["t1.3", "t0.7"])
def test_lenience_never_samples_above_p_over_l(name, lenience):
    params = PARAMS[name]
    p = reference_p(LENIENT_LOGITS, params)
    x, verdict = run(SpeculativeSamplingVerifier(lenience), 1, params, seed=51, q=LENIENT_Q[:1], logits=LENIENT_LOGITS)
    check_structure(x, verdict)
    exact = lenient_output(p[0], LENIENT_Q[0], lenience)
    assert torch.all(exact <= p[0] / lenience + 1e-12)  # the A.5 guarantee holds for the exact law ...
    assert torch.isclose(exact, p[0] / lenience, atol=1e-12).any()  # ... and is tight for some token here
    freq = torch.bincount(verdict.tokens[:, 0], minlength=V).double() / B
    sigma = (exact * (1 - exact) / B).sqrt()
    assert torch.all(freq <= p[0] / lenience + 5 * sigma + 1e-9)  # ... and for the verifier's samples
    assert chi2_pvalue(verdict.tokens[:, 0], exact) > P_THRESHOLD  # it is exactly the lenient law
    assert chi2_pvalue(verdict.tokens[:, 0], p[0]) < P_THRESHOLD  # which is not p: lenience changes the output
    # the bonus position (all drafts accepted) is still drawn from p
    assert chi2_pvalue(verdict.tokens[verdict.num_accepted == 1, 1], p[1]) > P_THRESHOLD


@pytest.mark.parametrize("name", ["t1.3", "t0.7"])
def test_lenience_raises_acceptance_rate_as_theory_predicts(name):
    params = PARAMS[name]
    p = reference_p(LENIENT_LOGITS[0], params)
    rates = []
    for lenience in (1.0, 0.8, 0.5, 0.2):
        _, verdict = run(
            SpeculativeSamplingVerifier(lenience), 1, params, seed=61, q=LENIENT_Q[:1], logits=LENIENT_LOGITS
        )
        rate = float((verdict.num_accepted == 1).double().mean())
        alpha = float(lenient_acceptance_rate(p, LENIENT_Q[0], lenience))
        assert abs(rate - alpha) <= 5 * math.sqrt(max(alpha * (1 - alpha), 1e-12) / B) + 1e-12, (lenience, rate, alpha)
        rates.append(rate)
    assert rates == sorted(rates) and rates[-1] > rates[0] + 0.1


@pytest.mark.parametrize("lenience", [0.5, 0.2])
def test_lenience_with_deterministic_draft_accepts_with_min_1_p_over_l(lenience):
    params = PARAMS["t1.3"]
    p = reference_p(TARGET_LOGITS, params)
    token = 2
    _, verdict = run(SpeculativeSamplingVerifier(lenience), 1, params, seed=71, fixed_draft=[token])
    expected = min(1.0, float(p[0, token]) / lenience)
    rate = float((verdict.num_accepted == 1).double().mean())
    assert abs(rate - expected) <= 5 * math.sqrt(max(expected * (1 - expected), 1e-12) / B) + 1e-9


@pytest.mark.parametrize("bad", [0.0, -0.5, 1.0000001, 1.5, float("nan"), float("inf"), -float("inf")])
def test_lenience_outside_unit_interval_raises(bad):
    with pytest.raises(DraftVerifyError):
        SpeculativeSamplingVerifier(lenience=bad)


@pytest.mark.parametrize("bad", [None, "0.5"])
def test_non_numeric_lenience_raises_draftverify_error(bad):
    with pytest.raises(DraftVerifyError):
        SpeculativeSamplingVerifier(lenience=bad)


def test_lossless_flag_only_at_lenience_one():
    assert SpeculativeSamplingVerifier().lossless is True
    assert SpeculativeSamplingVerifier(1.0).lossless is True
    assert SpeculativeSamplingVerifier(0.5).lossless is False


# ----------------------------------------------------------------------------------------------------------
# temperature 0: argmax lenience (accept x iff p(x) >= l * max p)
# ----------------------------------------------------------------------------------------------------------

GREEDY_PROBS = torch.tensor([0.05, 0.25, 0.4, 0.15, 0.1, 0.03, 0.015, 0.005], dtype=torch.float64)
# p / max p = 0.125, 0.625, 1, 0.375, 0.25, 0.075, 0.0375, 0.0125


@pytest.mark.parametrize("lenience", [1.0, 0.6, 0.3, 0.2, 0.05, 0.01])
def test_temperature_zero_lenience_accepts_iff_p_at_least_l_max_p(lenience):
    logits = GREEDY_PROBS.log()
    ratio = GREEDY_PROBS / GREEDY_PROBS.max()
    assert (ratio - lenience).abs().min() > 1e-3 or lenience == 1.0  # no boundary ties
    x = torch.arange(V)[:, None]  # row v drafts token v
    target = torch.stack([logits, logits.flip(-1)])[None].expand(V, 2, V)
    for params in (SamplingParams(), SamplingParams(temperature=0.0, top_k=1, top_p=0.1)):
        verdict = SpeculativeSamplingVerifier(lenience).verify(Draft(tokens=x), target, params, None)
        expected = ratio >= lenience
        assert torch.equal(verdict.num_accepted, expected.long())
        # accepted: the draft then the argmax at the next position; rejected: the argmax at position 0
        assert torch.equal(verdict.tokens[:, 0], torch.where(expected, x[:, 0], torch.tensor(2)))
        assert torch.equal(verdict.tokens[:, 1], torch.where(expected, torch.tensor(5), torch.tensor(-1)))


def test_temperature_zero_lenience_prefix_semantics():
    logits = torch.stack(
        [GREEDY_PROBS.log(), GREEDY_PROBS.roll(1).log(), GREEDY_PROBS.roll(2).log(), GREEDY_PROBS.roll(3).log()]
    )  # argmax 2, 3, 4, 5
    verifier = SpeculativeSamplingVerifier(0.3)
    # position i is GREEDY_PROBS rolled by i, so token t there has the ratio of token t - i
    # ratios: pos0 token 1 0.625 ok; pos1 token 4 (= orig 3) 0.375 ok; pos2 token 3 (= orig 1) 0.625 ok
    drafts = torch.tensor(
        [
            [1, 4, 3],  # all accepted -> bonus argmax 5
            [1, 4, 0],  # third rejected (orig token 6: 0.0375) -> n=2, append argmax 4
            [1, 1, 4],  # second rejected (orig token 0: 0.125) -> n=1, append argmax 3
            [0, 4, 3],  # first rejected (0.125) even though later ones would pass -> n=0, append 2
        ]
    )
    verdict = verifier.verify(Draft(tokens=drafts), logits[None].expand(4, 4, V), SamplingParams(), None)
    assert verdict.num_accepted.tolist() == [3, 2, 1, 0]
    assert verdict.tokens.tolist() == [[1, 4, 3, 5], [1, 4, 4, -1], [1, 3, -1, -1], [2, -1, -1, -1]]


def test_temperature_zero_lenience_one_equals_greedy_verifier():
    gen = torch.Generator().manual_seed(81)
    for trial in range(200):
        n = int(torch.randint(0, 5, (1,), generator=gen))
        batch = int(torch.randint(1, 5, (1,), generator=gen))
        logits = torch.randn(batch, n + 1, V, generator=gen, dtype=torch.float64) * 2
        draft = logits[:, :n].argmax(-1)
        corrupt = torch.rand(batch, n, generator=gen) < 0.3
        draft = torch.where(corrupt, torch.randint(0, V, (batch, n), generator=gen), draft)
        a = SpeculativeSamplingVerifier(1.0).verify(Draft(tokens=draft), logits, SamplingParams(), None)
        b = GreedyVerifier().verify(Draft(tokens=draft), logits, SamplingParams(), None)
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.num_accepted, b.num_accepted)

"""Gumbel-max coupled verification: exact (every emitted position follows p, positions independent), acceptance
as theory.gumbel_acceptance_rate says, and the seeded text fixed by (seed, position) alone.

Coupled noise is keyed by (seed, position), so batch rows of one call share it; independent runs are separate
calls with separate seeds. Logits are the hand-made, prefix-independent ones of test_rejection, so the target's
own sampling emits p_j at position j independently of everything else.
"""

from __future__ import annotations

import pytest
import torch
from test_rejection import DRAFT_Q, P_THRESHOLD, PARAMS, TARGET_LOGITS, V, chi2_pvalue, reference_p

from draftverify.errors import DraftVerifyError
from draftverify.sampling import draw, gumbel_noise
from draftverify.theory import acceptance_rate, gumbel_acceptance_rate
from draftverify.types import Draft, SamplingParams
from draftverify.verifiers import GreedyVerifier, GumbelCouplingVerifier, coupled as coupled_module

RUNS = 4000


def coupled(params: SamplingParams) -> SamplingParams:
    return SamplingParams(params.temperature, params.top_k, params.top_p, seed=None, coupling=True)


def run(
    params: SamplingParams,
    n: int,
    runs: int = RUNS,
    seed0: int = 0,
    position: int = 0,
    logits: torch.Tensor = TARGET_LOGITS,
    q: torch.Tensor = DRAFT_Q,
):
    """runs independent coupled steps: drafts drawn from q [N, V] with the shared noise, then verified.
    Returns (drafts [R, n], emitted tokens [R, n+1] -1 padded, num_accepted [R])."""
    params = coupled(params)
    verifier = GumbelCouplingVerifier()
    drafts, tokens, accepted = [], [], []
    for r in range(runs):
        gen = torch.Generator().manual_seed(seed0 + r)
        x = [draw(q[i].float()[None], params, gen, position + i) for i in range(n)]
        x = torch.stack(x, dim=1) if x else torch.zeros(1, 0, dtype=torch.long)
        verdict = verifier.verify(
            Draft(tokens=x, q_probs=q[:n].float()[None], position=position), logits[: n + 1][None], params, gen
        )
        drafts.append(x[0])
        tokens.append(verdict.tokens[0])
        accepted.append(verdict.num_accepted[0])
    return torch.stack(drafts), torch.stack(tokens), torch.stack(accepted)


@pytest.mark.parametrize("name", ["t0.7", "topk3", "t0.9_topk5_topp0.9"])
def test_every_emitted_position_follows_the_target(name):
    params = PARAMS[name]
    p = reference_p(TARGET_LOGITS, params)
    near = 0.6 * p[:2] + 0.4 * DRAFT_Q[:2]  # close enough to p that many rows reach the bonus position
    x, tokens, n = run(params, 2, seed0=100 * list(PARAMS).index(name), q=near)
    for j in range(3):
        rows = n >= j
        assert int(rows.sum()) > 500  # enough rows reach position j for the check to mean something
        pval = chi2_pvalue(tokens[rows, j], p[j])
        assert pval > P_THRESHOLD, f"position {j}: p-value {pval:.3g}"
    # accepted prefixes are the draft's, and a rejected draft token is never what is emitted in its place
    prefix = torch.arange(2)[None] < n[:, None]
    assert torch.equal(tokens[:, :2][prefix], x[prefix])
    rejected = n < 2
    assert (tokens[rejected, n[rejected]] != x[rejected, n[rejected]]).all()


def test_consecutive_positions_are_independent():
    """Position-keyed noise: tokens at positions 0 and 1 (same logits) are independent draws from p."""
    params = PARAMS["t1.3"]
    logits = TARGET_LOGITS[:1].expand(2, V)
    p = reference_p(logits[0], params)
    pairs = [run(params, 0, position=position, logits=logits)[1][:, 0] for position in (0, 1)]
    joint = pairs[0] * V + pairs[1]
    assert chi2_pvalue(joint, torch.outer(p, p).flatten()) > P_THRESHOLD


def test_wrong_rule_same_noise_at_every_position_is_rejected(monkeypatch):
    real = coupled_module.gumbel_noise
    monkeypatch.setattr(
        coupled_module,
        "gumbel_noise",
        lambda seed, start, count, vocab, device: real(seed, 0, 1, vocab, device).expand(count, vocab),
    )
    params = PARAMS["t1.3"]
    logits = TARGET_LOGITS[:1].expand(2, V)
    p = reference_p(logits[0], params)
    pairs = [run(params, 0, runs=1000, position=position, logits=logits)[1][:, 0] for position in (0, 1)]
    assert torch.equal(pairs[0], pairs[1])
    assert chi2_pvalue(pairs[0] * V + pairs[1], torch.outer(p, p).flatten()) < P_THRESHOLD


def test_wrong_rule_noise_on_untempered_probabilities_is_rejected(monkeypatch):
    params = PARAMS["t0.7"]
    monkeypatch.setattr(coupled_module, "probs_from_logits", lambda logits, _: logits.float().softmax(-1))
    _, tokens, _ = run(params, 0, runs=1000)
    assert chi2_pvalue(tokens[:, 0], reference_p(TARGET_LOGITS[0], params)) < P_THRESHOLD


@pytest.mark.parametrize("name", ["t1.3", "topp0.8"])
def test_acceptance_rate_is_the_gumbel_formula_and_below_speculative_sampling(name):
    params = PARAMS[name]
    p = reference_p(TARGET_LOGITS[0], params)
    _, _, n = run(params, 1, seed0=7)
    rate = float((n == 1).double().mean())
    expected = float(gumbel_acceptance_rate(p, DRAFT_Q[0]))
    assert abs(rate - expected) < 5 * (expected * (1 - expected) / RUNS) ** 0.5
    assert expected < float(acceptance_rate(p, DRAFT_Q[0]))


def test_the_same_seed_and_position_always_give_the_same_verdict():
    params = coupled(PARAMS["t1.3"])
    verdicts = []
    for _ in range(2):
        gen = torch.Generator().manual_seed(5)
        draft = Draft(tokens=torch.tensor([[1, 2, 3]]), position=17)
        verdicts.append(GumbelCouplingVerifier().verify(draft, TARGET_LOGITS[None], params, gen).tokens)
    assert torch.equal(verdicts[0], verdicts[1])


def test_emitted_tokens_do_not_depend_on_the_draft():
    """Whatever is proposed, the emitted tokens are the target's own draws at those positions."""
    params = coupled(PARAMS["t0.9_topk5_topp0.9"])
    noise = gumbel_noise(11, 0, 4, V)
    target_draws = (reference_p(TARGET_LOGITS, params).float().log() + noise).argmax(-1)  # [4]
    for proposal in ([], [0], target_draws[:2].tolist(), target_draws[:3].tolist(), [7, 7, 7]):
        gen = torch.Generator().manual_seed(11)
        draft = Draft(tokens=torch.tensor([proposal], dtype=torch.long).reshape(1, -1), position=0)
        verdict = GumbelCouplingVerifier().verify(draft, TARGET_LOGITS[: len(proposal) + 1][None], params, gen)
        k = int(verdict.num_accepted[0]) + 1
        assert verdict.tokens[0, :k].tolist() == target_draws[:k].tolist()


def test_greedy_params_give_greedy_verification():
    logits = torch.randn(3, 5, V, generator=torch.Generator().manual_seed(0))
    draft = Draft(tokens=logits[:, :4].argmax(-1).roll(1, dims=1), position=0)
    a = GumbelCouplingVerifier().verify(draft, logits, SamplingParams(), None)
    b = GreedyVerifier().verify(draft, logits, SamplingParams(), None)
    assert torch.equal(a.tokens, b.tokens)


def test_missing_position_and_explicit_no_coupling_are_clear_errors():
    with pytest.raises(DraftVerifyError, match="draft.position"):
        GumbelCouplingVerifier().verify(
            Draft(tokens=torch.tensor([[1]])),
            TARGET_LOGITS[None, :2],
            coupled(PARAMS["t1.3"]),
            torch.Generator().manual_seed(0),
        )
    with pytest.raises(DraftVerifyError, match="coupling=False"):
        GumbelCouplingVerifier().check_params(SamplingParams(temperature=1.0, seed=0, coupling=False))

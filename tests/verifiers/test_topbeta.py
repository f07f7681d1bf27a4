"""TopBetaVerifier (SpecDec++ eqs. 6 and 7): keep x if it is in the target's top-beta (eq. 6) and
log p(top-1) - log p(x) <= tau (eq. 7). Logits are chosen so log-prob gaps equal logit gaps."""

from __future__ import annotations

import pytest
import torch

from draftverify.errors import DraftVerifyError
from draftverify.types import Draft, SamplingParams
from draftverify.verifiers import GreedyVerifier, TopBetaVerifier

torch.set_num_threads(1)

# ranks by logit: token 3 (5.0), token 0 (4.8), token 5 (4.1), token 1 (2.5), token 4 (1.0), token 2 (0.0)
ROW = torch.tensor([4.8, 2.5, 0.0, 5.0, 1.0, 4.1], dtype=torch.float64)
V = ROW.numel()
# gaps to the top-1 (no tau below sits within 0.05 of one): token 3: 0, token 0: 0.2, token 5: 0.9,
# token 1: 2.5, token 4: 4.0, token 2: 5.0


def _verify(verifier, drafts, logits=None, params=SamplingParams(), generator=None):
    drafts = torch.tensor(drafts, dtype=torch.long)
    if logits is None:
        logits = ROW.repeat(drafts.shape[1] + 1, 1)
    logits = logits[None].expand(drafts.shape[0], -1, -1)
    return verifier.verify(Draft(tokens=drafts), logits, params, generator)


def _accepted_single(verifier, token: int) -> bool:
    return bool(_verify(verifier, [[token]]).num_accepted[0] == 1)


def test_eq6_alone_rejects():
    """Within tau of the top-1 but outside the top-beta: rejected by eq. 6 only."""
    verifier = TopBetaVerifier(beta=1, tau=10.0)
    assert _accepted_single(verifier, 3)
    assert not _accepted_single(verifier, 0)  # gap 0.2 <= 10, rank 2 > beta
    verifier = TopBetaVerifier(beta=2, tau=10.0)
    assert _accepted_single(verifier, 0)
    assert not _accepted_single(verifier, 5)  # gap 0.9 <= 10, rank 3 > beta


def test_eq7_alone_rejects():
    """Inside the top-beta but too far below the top-1: rejected by eq. 7 only."""
    verifier = TopBetaVerifier(beta=6, tau=0.5)
    assert _accepted_single(verifier, 0)  # gap 0.2
    assert not _accepted_single(verifier, 5)  # rank 3 <= 6, gap 0.9 > 0.5
    verifier = TopBetaVerifier(beta=4, tau=2.0)
    assert _accepted_single(verifier, 5)
    assert not _accepted_single(verifier, 1)  # rank 4 <= 4, gap 2.5 > 2


@pytest.mark.parametrize(
    "beta,tau,accepted",
    [
        (1, 0.0, {3}),
        (2, 0.1, {3}),
        (2, 0.3, {3, 0}),
        (3, 1.5, {3, 0, 5}),
        (3, 100.0, {3, 0, 5}),
        (5, 3.0, {3, 0, 5, 1}),
        (6, 100.0, {0, 1, 2, 3, 4, 5}),
        (50, 4.5, {3, 0, 5, 1, 4}),  # beta larger than the vocabulary
    ],
)
def test_accepted_set_is_intersection_of_eq6_and_eq7(beta, tau, accepted):
    verifier = TopBetaVerifier(beta=beta, tau=tau)
    drafts = [[t] for t in range(V)]
    verdict = _verify(verifier, drafts)
    got = {t for t in range(V) if int(verdict.num_accepted[t]) == 1}
    assert got == accepted
    # rejected rows emit the target's argmax, accepted rows emit the draft then the argmax
    for t in range(V):
        expected = [t, 3] if t in accepted else [3, -1]
        assert verdict.tokens[t].tolist() == expected


def test_prefix_semantics_and_padding():
    logits = torch.stack([ROW, ROW.roll(1), ROW.roll(2), ROW.roll(3)])  # argmax 3, 4, 5, 0
    verifier = TopBetaVerifier(beta=3, tau=1.0)
    # at position i the token t has the score of ROW[t - i]; accepted tokens at position 0: {3, 0, 5}
    drafts = [
        [0, 4, 1],  # ROW[0], ROW[3], ROW[5]: all accepted -> bonus argmax 0
        [5, 1, 2],  # ROW[5], ROW[0], ROW[0]: all accepted
        [3, 2, 3],  # ROW[3], ROW[1] (rank 4): rejected at 1 -> append argmax 4
        [1, 4, 5],  # ROW[1] rejected at 0 although later ones would pass -> append 3
        [3, 4, 2],  # ROW[3], ROW[3], ROW[0]: all accepted
        [3, 4, 1],  # ROW[3], ROW[3], ROW[5] (gap 0.9 <= 1): accepted
        [3, 4, 0],  # ROW[3], ROW[3], ROW[4] (rank 5): rejected at 2 -> append 5
    ]
    verdict = _verify(verifier, drafts, logits=logits)
    assert verdict.num_accepted.tolist() == [3, 3, 1, 0, 3, 3, 2]
    assert verdict.tokens.tolist() == [
        [0, 4, 1, 0],
        [5, 1, 2, 0],
        [3, 4, -1, -1],
        [3, -1, -1, -1],
        [3, 4, 2, 0],
        [3, 4, 1, 0],
        [3, 4, 5, -1],
    ]


def test_scores_are_log_probabilities_not_raw_logit_scales():
    """A constant shift of one position's logits does not change the verdict (log_softmax gaps)."""
    drafts = torch.tensor([[0, 0]])
    logits = ROW.repeat(3, 1)[None].clone()
    a = TopBetaVerifier(2, 0.5).verify(Draft(tokens=drafts), logits, SamplingParams(), None)
    logits[:, 1] -= 100.0
    b = TopBetaVerifier(2, 0.5).verify(Draft(tokens=drafts), logits, SamplingParams(), None)
    assert torch.equal(a.tokens, b.tokens) and a.num_accepted.tolist() == [2]


def test_beta1_tau0_matches_greedy_on_random_logits():
    gen = torch.Generator().manual_seed(0)
    lengths = set()
    for _ in range(300):
        n = int(torch.randint(0, 6, (1,), generator=gen))
        batch = int(torch.randint(1, 5, (1,), generator=gen))
        vocab = int(torch.randint(2, 16, (1,), generator=gen))
        logits = torch.randn(batch, n + 1, vocab, generator=gen, dtype=torch.float64) * 3
        draft = logits[:, :n].argmax(-1)
        corrupt = torch.rand(batch, n, generator=gen) < 0.3
        draft = torch.where(corrupt, torch.randint(0, vocab, (batch, n), generator=gen), draft)
        a = TopBetaVerifier(beta=1, tau=0.0).verify(Draft(tokens=draft), logits, SamplingParams(), None)
        b = GreedyVerifier().verify(Draft(tokens=draft), logits, SamplingParams(), None)
        assert torch.equal(a.tokens, b.tokens)
        assert torch.equal(a.num_accepted, b.num_accepted)
        lengths.update(a.num_accepted.tolist())
    assert lengths == {0, 1, 2, 3, 4, 5}  # the trials exercised every accepted length


def test_relaxed_rule_accepts_at_least_greedy_prefix():
    gen = torch.Generator().manual_seed(1)
    for _ in range(100):
        logits = torch.randn(3, 5, 9, generator=gen, dtype=torch.float64)
        draft = torch.randint(0, 9, (3, 4), generator=gen)
        relaxed = TopBetaVerifier(beta=3, tau=1.0).verify(Draft(tokens=draft), logits, SamplingParams(), None)
        greedy = GreedyVerifier().verify(Draft(tokens=draft), logits, SamplingParams(), None)
        assert (relaxed.num_accepted >= greedy.num_accepted).all()


def test_empty_draft():
    verdict = _verify(TopBetaVerifier(), [[], []])
    assert verdict.num_accepted.tolist() == [0, 0]
    assert verdict.tokens.tolist() == [[3], [3]]


def test_sampled_params_append_a_target_sample():
    verdict = _verify(
        TopBetaVerifier(1, 0.0),
        [[0]],
        params=SamplingParams(temperature=1.0, top_k=1),
        generator=torch.Generator().manual_seed(0),
    )
    assert verdict.tokens.tolist() == [[3, -1]]


@pytest.mark.parametrize("bad", [0, -1, 1.5, 2.0, True, False, "3", None])
def test_bad_beta_raises(bad):
    with pytest.raises(DraftVerifyError):
        TopBetaVerifier(beta=bad, tau=1.0)


@pytest.mark.parametrize("bad", [-0.1, -1e-9, -float("inf"), float("nan")])
def test_bad_tau_raises(bad):
    with pytest.raises(DraftVerifyError):
        TopBetaVerifier(beta=3, tau=bad)


@pytest.mark.parametrize("bad", [None, "1.0"])
def test_non_numeric_tau_raises_draftverify_error(bad):
    with pytest.raises(DraftVerifyError):
        TopBetaVerifier(beta=3, tau=bad)


def test_lossless_flag_and_defaults():
    assert TopBetaVerifier(1, 0.0).lossless is True
    assert TopBetaVerifier(3, 1.0).lossless is False
    assert TopBetaVerifier(1, 0.5).lossless is False
    v = TopBetaVerifier()
    assert (v.beta, v.tau) == (3, 1.0)
    assert TopBetaVerifier.name == "topbeta"

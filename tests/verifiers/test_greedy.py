"""GreedyVerifier: keep the longest prefix equal to the target's argmax, then append the target's own token."""

from __future__ import annotations

import pytest
import torch

from draftverify.errors import DraftVerifyError
from draftverify.types import Draft, SamplingParams
from draftverify.verifiers import GreedyVerifier

torch.set_num_threads(1)

V = 5


def _logits_with_argmax(argmax: list[int], vocab: int = V) -> torch.Tensor:
    """[len(argmax), V] logits whose row i has its unique maximum at argmax[i]."""
    rows = torch.linspace(-1.0, 0.0, vocab, dtype=torch.float64).repeat(len(argmax), 1)
    for i, a in enumerate(argmax):
        rows[i, a] = 3.0
    return rows


def _reference(draft: list[int], argmax: list[int]) -> tuple[int, list[int]]:
    n = 0
    while n < len(draft) and draft[n] == argmax[n]:
        n += 1
    tokens = draft[:n] + [argmax[n]] + [-1] * (len(draft) - n)
    return n, tokens


def test_hand_made_verdicts():
    argmax = [2, 0, 4, 1]  # positions 0..N (N = 3)
    logits = _logits_with_argmax(argmax)[None].expand(6, 4, V)
    drafts = torch.tensor(
        [
            [2, 0, 4],  # everything accepted: bonus argmax 1
            [2, 0, 3],  # last rejected
            [2, 1, 4],  # second rejected; the later match does not count
            [3, 0, 4],  # first rejected although the rest match
            [0, 0, 0],
            [2, 0, 1],
        ]
    )
    verdict = GreedyVerifier().verify(Draft(tokens=drafts), logits, SamplingParams(), None)
    assert verdict.num_accepted.tolist() == [3, 2, 1, 0, 0, 2]
    assert verdict.tokens.tolist() == [
        [2, 0, 4, 1],
        [2, 0, 4, -1],
        [2, 0, -1, -1],
        [2, -1, -1, -1],
        [2, -1, -1, -1],
        [2, 0, 4, -1],
    ]
    assert verdict.tokens.dtype == torch.long and verdict.num_accepted.dtype == torch.long


def test_each_row_uses_its_own_logits():
    logits = torch.stack([_logits_with_argmax([1, 2, 3]), _logits_with_argmax([1, 4, 0])])
    drafts = torch.tensor([[1, 2], [1, 2]])
    verdict = GreedyVerifier().verify(Draft(tokens=drafts), logits, SamplingParams(), None)
    assert verdict.num_accepted.tolist() == [2, 1]
    assert verdict.tokens.tolist() == [[1, 2, 3], [1, 4, -1]]


def test_empty_draft_appends_the_target_argmax():
    logits = _logits_with_argmax([3])[None]
    verdict = GreedyVerifier().verify(Draft(tokens=torch.zeros(1, 0, dtype=torch.long)), logits, SamplingParams(), None)
    assert verdict.num_accepted.tolist() == [0]
    assert verdict.tokens.tolist() == [[3]]


def test_q_probs_are_ignored():
    logits = _logits_with_argmax([2, 0, 4])[None]
    drafts = torch.tensor([[2, 1]])
    q = torch.full((1, 2, V), 1.0 / V)
    a = GreedyVerifier().verify(Draft(tokens=drafts, q_probs=q), logits, SamplingParams(), None)
    b = GreedyVerifier().verify(Draft(tokens=drafts), logits, SamplingParams(), None)
    assert torch.equal(a.tokens, b.tokens) and a.tokens.tolist() == [[2, 0, -1]]


def test_random_logits_match_reference():
    gen = torch.Generator().manual_seed(0)
    for _ in range(300):
        n = int(torch.randint(0, 6, (1,), generator=gen))
        batch = int(torch.randint(1, 4, (1,), generator=gen))
        vocab = int(torch.randint(2, 12, (1,), generator=gen))
        logits = torch.randn(batch, n + 1, vocab, generator=gen, dtype=torch.float64)
        argmax = logits.argmax(-1)
        draft = torch.where(
            torch.rand(batch, n, generator=gen) < 0.25,
            torch.randint(0, vocab, (batch, n), generator=gen),
            argmax[:, :n],
        )
        verdict = GreedyVerifier().verify(Draft(tokens=draft), logits, SamplingParams(), None)
        for b in range(batch):
            n_ref, tokens_ref = _reference(draft[b].tolist(), argmax[b].tolist())
            assert int(verdict.num_accepted[b]) == n_ref
            assert verdict.tokens[b].tolist() == tokens_ref


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.7), SamplingParams(temperature=1.0, top_k=5)])
def test_check_params_rejects_sampling(params):
    with pytest.raises(DraftVerifyError):
        GreedyVerifier().check_params(params)


def test_check_params_accepts_greedy_and_is_lossless():
    GreedyVerifier().check_params(SamplingParams())
    assert GreedyVerifier.lossless is True
    assert GreedyVerifier.name == "greedy"


def test_one_row_verdict_equals_the_batched_rule():
    """One row takes a list walk (verifiers/base.py greedy_verdict); its verdict is the tensor rule's, path included."""
    from draftverify.verifiers.base import accepted_prefix_length, gather_at, greedy_verdict, make_verdict

    gen = torch.Generator().manual_seed(1)
    for _ in range(200):
        n = int(torch.randint(0, 7, (1,), generator=gen))
        choice = torch.randint(0, 4, (1, n + 1), generator=gen)
        draft = torch.where(
            torch.rand(1, n, generator=gen) < 0.3, torch.randint(0, 4, (1, n), generator=gen), choice[:, :n]
        )
        got = greedy_verdict(draft, choice)
        accepted = accepted_prefix_length(draft == choice[:, :n])
        want = make_verdict(draft, accepted, gather_at(choice, accepted))
        for field in ("tokens", "num_accepted", "path"):
            a, b = getattr(got, field), getattr(want, field)
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), field

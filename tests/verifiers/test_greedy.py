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


def test_the_host_walk_gives_the_tensor_rules_verdict_for_batches_and_ragged_rows():
    """A chain on the CPU is judged on Python ints (verifiers/base.py greedy_chain_verdict, one argmax call); its
    verdict is the tensor rule's, path included, for one row, for batches, and for rows with lengths of their own."""
    from draftverify.verifiers.base import (
        accepted_prefix_length,
        gather_at,
        greedy_chain_verdict,
        make_verdict,
        within_draft,
    )

    gen = torch.Generator().manual_seed(1)
    for trial in range(300):
        rows = 1 if trial < 100 else int(torch.randint(1, 5, (1,), generator=gen))
        n = int(torch.randint(0, 7, (1,), generator=gen))
        choice = torch.randint(0, 4, (rows, n + 1), generator=gen)
        tokens = torch.where(
            torch.rand(rows, n, generator=gen) < 0.3, torch.randint(0, 4, (rows, n), generator=gen), choice[:, :n]
        )
        lengths = torch.randint(0, n + 1, (rows,), generator=gen) if trial % 2 else None
        draft = Draft(tokens=tokens, lengths=lengths)
        got = greedy_chain_verdict(draft, choice.tolist())
        accepted = accepted_prefix_length(within_draft(draft, tokens == choice[:, :n]))
        want = make_verdict(tokens, accepted, gather_at(choice, accepted))
        for field in ("tokens", "num_accepted", "path"):
            a, b = getattr(got, field), getattr(want, field)
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), (trial, field)
        assert got.accepted == want.accepted and got.rows == want.rows


def test_the_verifier_judges_cpu_logits_on_the_host_whatever_their_dtype():
    logits = torch.randn(3, 4, 11)
    tokens = logits.argmax(dim=-1)[:, :3].clone()
    tokens[1, 1] = (tokens[1, 1] + 1) % 11  # row 1 parts at its second draft token
    draft = Draft(tokens=tokens, lengths=torch.tensor([3, 3, 1]))
    host = GreedyVerifier().verify(draft, logits, SamplingParams(), None)
    assert host.accepted == [3, 1, 1]
    half = GreedyVerifier().verify(draft, logits.to(torch.float16), SamplingParams(), None)  # torch's argmax
    assert half.accepted == host.accepted and torch.equal(half.path, host.path)

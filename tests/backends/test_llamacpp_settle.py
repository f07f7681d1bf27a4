"""Settling a greedy tree verdict against one-token decoding (llamacpp_settle.py), with a stand-in for
LlamaCppLM.rescore_branch: the cut, the chain's next token, what is left alone, and the verifier wrapper the loop
takes from the backend (backends/base.py wrap_verifier). The re-scoring itself on llama.cpp is tested in
test_backend_llamacpp.py, and bit for bit on the kernels that make it exact in test_llamacpp_kernels.py."""

from __future__ import annotations

import pytest
import torch

from draftverify.backends.base import wrap_verifier
from draftverify.backends.llamacpp_settle import SettlingVerifier, settle
from draftverify.engine.step import kept_positions
from draftverify.errors import DraftVerifyError
from draftverify.tree import TreeSpec
from draftverify.types import Draft, SamplingParams
from draftverify.verifiers.exact import ExactVerifier
from draftverify.verifiers.greedy import GreedyVerifier
from draftverify.verifiers.tree import TreeGreedyVerifier, tree_greedy

VOCAB = 10


class Rescoring:
    """A target whose tree pass scored the kept branch's first m tail offsets as a chain: it hands back the chain's
    argmax tokens after the rest (one-hot logits), or None when m covers the branch."""

    def __init__(self, m: int, chain_tokens: list[int]):
        self.m, self.chain_tokens, self.asked = m, chain_tokens, []

    def rescore_branch(self, kept: list[int]):
        self.asked.append(kept)
        if self.m >= len(kept):
            return None
        assert len(self.chain_tokens) == len(kept) - self.m
        return self.m, torch.nn.functional.one_hot(torch.tensor([self.chain_tokens]), VOCAB).float()  # [1, n, V]


# root children: nodes 0 (token 3) and 1 (token 4); node 2 (token 5) under node 1; node 3 (token 6) under node 2
TREE = TreeSpec.from_parents([-1, -1, 1, 2])
DRAFT = Draft(tokens=torch.tensor([[3, 4, 5, 6]]), tree=TREE)
CHOICE = [4, 0, 5, 6, 9]  # the tree pass's argmax: pending -> 4, node 1 -> 5, 2 -> 6, 3 -> 9


def tree_logits() -> torch.Tensor:
    """The tree pass's logits [1, 1+N, V], whose argmax is CHOICE."""
    return torch.nn.functional.one_hot(torch.tensor([CHOICE]), VOCAB).float()


def test_a_greedy_tree_verdict_is_cut_where_the_rescored_chain_parts_from_the_branch():
    verdict = tree_greedy(DRAFT.tokens, TREE, torch.tensor([CHOICE]))
    assert verdict.num_accepted.tolist() == [3] and verdict.tokens[0, :4].tolist() == [4, 5, 6, 9]
    # offsets [0, 2, 3, 4]: the pending token took the first cell, node 1 (offset 2) sat past node 0's cell: m = 1.
    # The chain's argmax after node 1 is 5 (agrees), after node 2 it is 7 (parts from node 3's 6)
    target = Rescoring(1, [5, 7, 8])
    settled = settle(target.rescore_branch, DRAFT, verdict)
    assert target.asked == [[0, 2, 3, 4]]
    assert settled.num_accepted.tolist() == [2] and settled.tokens[0, :3].tolist() == [4, 5, 7]
    assert kept_positions(DRAFT, settled).tolist() == [[0, 2, 3]]  # a prefix of the re-scored branch
    agreeing = Rescoring(1, [5, 6, 9])  # the chain agrees everywhere: the verdict stands, next token included
    settled = settle(agreeing.rescore_branch, DRAFT, verdict)
    assert settled.num_accepted.tolist() == [3] and settled.tokens[0, :4].tolist() == [4, 5, 6, 9]
    assert settle(Rescoring(5, []).rescore_branch, DRAFT, verdict) is None  # the whole branch took a chain's cells


def test_a_rescore_must_keep_the_pending_tokens_logits():
    verdict = tree_greedy(DRAFT.tokens, TREE, torch.tensor([CHOICE]))
    with pytest.raises(DraftVerifyError, match="pending token"):
        settle(Rescoring(0, [4, 5, 6, 9]).rescore_branch, DRAFT, verdict)


def test_the_wrapped_verifier_settles_greedy_tree_verdicts_and_counts_the_second_forward():
    target = Rescoring(1, [5, 7, 8])
    wrapped = SettlingVerifier(TreeGreedyVerifier(), target.rescore_branch)
    verdict = wrapped.verify(DRAFT, tree_logits(), SamplingParams(), None)
    assert verdict.num_accepted.tolist() == [2] and verdict.tokens[0, :3].tolist() == [4, 5, 7]
    assert verdict.target_s is not None and verdict.target_s >= 0  # the step's stats: target time, a second call
    exact = SettlingVerifier(TreeGreedyVerifier(), Rescoring(5, []).rescore_branch).verify(
        DRAFT, tree_logits(), SamplingParams(), None
    )
    assert exact.num_accepted.tolist() == [3] and exact.target_s is None  # nothing scored again: one target call
    inner = TreeGreedyVerifier()
    assert (wrapped.name, wrapped.lossless, wrapped.accepts_trees) == (inner.name, inner.lossless, inner.accepts_trees)
    assert (wrapped.supports_batch, wrapped.per_row_params) == (inner.supports_batch, inner.per_row_params)


def test_chains_and_verdicts_at_a_temperature_are_left_alone():
    untouched = Rescoring(1, [5, 7, 8])
    chain = Draft(tokens=torch.tensor([[4, 5]]))
    chain_logits = torch.nn.functional.one_hot(torch.tensor([[4, 5, 6]]), VOCAB).float()  # [1, 3, V]
    greedy_chain = SettlingVerifier(GreedyVerifier(), untouched.rescore_branch)
    verdict = greedy_chain.verify(chain, chain_logits, SamplingParams(), None)
    assert verdict.num_accepted.tolist() == [2] and verdict.target_s is None
    sampled = SamplingParams(temperature=0.7)  # the exact rule samples a tree through tree speculative sampling
    settling = SettlingVerifier(ExactVerifier(sampled), untouched.rescore_branch)
    verdict = settling.verify(DRAFT, tree_logits() * 20, sampled, torch.Generator().manual_seed(0))
    assert verdict.target_s is None and untouched.asked == []


def test_the_loop_takes_the_verifier_a_backend_wraps_and_otherwise_the_verifier_itself():
    class Wrapping:
        def wrap_verifier(self, verifier):
            return SettlingVerifier(verifier, Rescoring(1, [5, 7, 8]).rescore_branch)

    rule = TreeGreedyVerifier()
    assert wrap_verifier(object(), rule) is rule
    wrapped = wrap_verifier(Wrapping(), rule)
    assert isinstance(wrapped, SettlingVerifier) and wrapped.verifier is rule

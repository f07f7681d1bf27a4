"""The step's verbs on their own: the verify layout, what the cache keeps, what the drafter hears."""

from __future__ import annotations

import pytest
import torch

from draftverify.engine.step import kept_positions, score, scored_for_drafter, settle, verify_layout
from draftverify.errors import DraftVerifyError
from draftverify.tree import TreeSpec
from draftverify.types import DecodingState, Draft, SamplingParams, TargetOutput, Verdict
from draftverify.verifiers.tree import TreeGreedyVerifier, tree_greedy


class Held:
    length = 7  # positions the target's cache holds


def test_a_chain_is_scored_in_causal_order_and_a_tree_with_its_ancestor_mask():
    assert verify_layout(Held(), Draft(tokens=torch.zeros(1, 3, dtype=torch.long))) == (None, None)
    tree = TreeSpec.from_paths([(0,), (1,), (0, 0)])
    positions, mask = verify_layout(Held(), Draft(tokens=torch.zeros(1, 3, dtype=torch.long), tree=tree))
    assert positions.tolist() == [[7, 8, 8, 9]]
    assert mask.int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]


def test_the_cache_keeps_each_rows_pending_token_and_accepted_drafts():
    chain = Draft(tokens=torch.zeros(2, 3, dtype=torch.long))
    verdict = Verdict(
        tokens=torch.zeros(2, 4, dtype=torch.long),
        num_accepted=torch.tensor([2, 0]),
        path=torch.tensor([[0, 1, -1], [-1, -1, -1]]),
    )
    assert kept_positions(chain, verdict).tolist() == [3, 1]
    tree = Draft(tokens=torch.zeros(2, 3, dtype=torch.long), tree=TreeSpec.from_paths([(0,), (1,), (0, 0)]))
    verdict = Verdict(
        tokens=torch.zeros(2, 4, dtype=torch.long),
        num_accepted=torch.tensor([2, 1]),
        path=torch.tensor([[0, 2, -1], [1, -1, -1]]),
    )
    assert kept_positions(tree, verdict).tolist() == [[0, 1, 3], [0, 2, -1]]


def test_the_drafter_hears_the_kept_positions_right_aligned_then_the_appended_ones():
    logits = torch.arange(2 * 6, dtype=torch.float).reshape(2, 6, 1)  # [B, 1+N+E, 1]: N = 3 drafts, E = 2 extras
    out = scored_for_drafter(TargetOutput(logits=logits), torch.tensor([3, 1]), Draft(tokens=torch.zeros(2, 3)))
    assert out.logits[..., 0].tolist() == [[0, 1, 2, 4, 5], [6, 6, 6, 10, 11]] and out.hidden is None


class Recording:
    """A target that records what each forward is given."""

    length = 7

    def __init__(self):
        self.calls = []

    def forward(self, tokens, position_ids, attention_mask, want_hidden=False, new_valid=None):
        self.calls.append((tokens, new_valid))
        return TargetOutput(logits=torch.zeros(*tokens.shape, 5))


class NoHidden:
    needs_target_hidden = False


def test_a_ragged_chain_is_scored_with_each_rows_columns_past_its_draft_as_padding():
    state = DecodingState(torch.tensor([[1, 2], [3, 4], [5, 6]]), None, 2, SamplingParams(), None)
    target = Recording()
    ragged = Draft(tokens=torch.ones(3, 4, dtype=torch.long), lengths=torch.tensor([4, 1, 0]))
    score(target, NoHidden(), state, ragged)
    tokens, new_valid = target.calls[-1]
    assert tokens[:, 0].tolist() == [2, 4, 6]  # each row's pending token first
    assert new_valid.int().tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]]
    score(target, NoHidden(), state, Draft(tokens=torch.ones(3, 4, dtype=torch.long)))  # every row drafted N
    assert target.calls[-1][1] is None
    one = DecodingState(torch.tensor([[1, 2]]), None, 2, SamplingParams(), None)  # one row: its draft is its own length
    score(target, NoHidden(), one, Draft(tokens=torch.ones(1, 2, dtype=torch.long), lengths=torch.tensor([2])))
    assert target.calls[-1][1] is None


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
        return self.m, torch.nn.functional.one_hot(torch.tensor([self.chain_tokens]), 10).float()  # [1, n, V]


def _tree_step(temperature: float = 0.0):
    # root children: nodes 0 (token 3) and 1 (token 4); node 2 (token 5) under node 1; node 3 (token 6) under node 2
    tree = TreeSpec.from_parents([-1, -1, 1, 2])
    draft = Draft(tokens=torch.tensor([[3, 4, 5, 6]]), tree=tree)
    choice = torch.tensor([[4, 0, 5, 6, 9]])  # the tree pass's argmax: pending -> 4, node 1 -> 5, 2 -> 6, 3 -> 9
    verdict = tree_greedy(draft.tokens, tree, choice)
    state = DecodingState(
        tokens=torch.tensor([[1, 2]]),
        source_ids=None,
        prompt_length=2,
        params=SamplingParams(temperature=temperature),
        generator=None,
    )
    return draft, verdict, state


def test_a_greedy_tree_verdict_is_cut_where_the_rescored_chain_parts_from_the_branch():
    draft, verdict, state = _tree_step()
    assert verdict.num_accepted.tolist() == [3] and verdict.tokens[0, :4].tolist() == [4, 5, 6, 9]
    # offsets [0, 2, 3, 4]: the pending token took the first cell, node 1 (offset 2) sat past node 0's cell: m = 1.
    # The chain's argmax after node 1 is 5 (agrees), after node 2 it is 7 (parts from node 3's 6)
    target = Rescoring(1, [5, 7, 8])
    settled, rescored = settle(target, TreeGreedyVerifier(), draft, verdict, state)
    assert rescored and target.asked == [[0, 2, 3, 4]]
    assert settled.num_accepted.tolist() == [2] and settled.tokens[0, :3].tolist() == [4, 5, 7]
    assert kept_positions(draft, settled).tolist() == [[0, 2, 3]]  # a prefix of the re-scored branch
    agreeing = Rescoring(1, [5, 6, 9])  # the chain agrees everywhere: the verdict stands, next token included
    settled, _ = settle(agreeing, TreeGreedyVerifier(), draft, verdict, state)
    assert settled.num_accepted.tolist() == [3] and settled.tokens[0, :4].tolist() == [4, 5, 6, 9]


def test_settle_leaves_chains_sampling_and_first_branch_verdicts_alone():
    draft, verdict, state = _tree_step()
    exact = Rescoring(5, [])  # the whole branch took a chain's cells
    assert settle(exact, TreeGreedyVerifier(), draft, verdict, state) == (verdict, False)
    _, _, sampled = _tree_step(temperature=0.7)
    untouched = Rescoring(1, [5, 7, 8])
    assert settle(untouched, TreeGreedyVerifier(), draft, verdict, sampled) == (verdict, False)
    chain = Draft(tokens=torch.tensor([[4, 5]]))
    assert settle(untouched, TreeGreedyVerifier(), chain, verdict, state) == (verdict, False)
    assert settle(object(), TreeGreedyVerifier(), draft, verdict, state) == (verdict, False)  # no rescore_branch
    assert untouched.asked == []


def test_a_rescore_must_keep_the_pending_tokens_logits():
    draft, verdict, state = _tree_step()
    with pytest.raises(DraftVerifyError, match="pending token"):
        settle(Rescoring(0, [4, 5, 6, 9]), TreeGreedyVerifier(), draft, verdict, state)

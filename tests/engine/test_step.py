"""The step's verbs on their own: the verify layout, what the cache keeps, what the drafter hears."""

from __future__ import annotations

import torch

from draftverify.engine.step import kept_positions, score, scored_for_drafter, verify_layout
from draftverify.tree import TreeSpec
from draftverify.types import DecodingState, Draft, SamplingParams, TargetOutput, Verdict


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

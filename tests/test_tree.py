"""Hand-drawn token trees: every buffer of TreeSpec asserted entry by entry, and malformed input refused.

The tree used throughout (node index: path):

    root (pending token)
    +-- 0: (0,)
    |   +-- 2: (0, 0)
    |   |   +-- 4: (0, 0, 0)
    |   +-- 3: (0, 1)
    +-- 1: (1,)
"""

from __future__ import annotations

import pytest
import torch

from draftverify.errors import DraftVerifyError
from draftverify.tree import TreeSpec
from draftverify.types import Draft
from draftverify.verifiers.base import make_verdict

PATHS = [(0,), (1,), (0, 0), (0, 1), (0, 0, 0)]


def test_buffers_of_a_hand_drawn_tree():
    tree = TreeSpec.from_paths(PATHS)
    assert tree.size == 5 and tree.max_depth == 3
    assert tree.parents.tolist() == [-1, -1, 0, 0, 2]
    assert tree.depth.tolist() == [1, 1, 2, 2, 3]
    assert tree.position_offsets.tolist() == [1, 1, 2, 2, 3]
    assert tree.ranks.tolist() == [0, 1, 0, 1, 0]
    assert tree.ancestor_mask.int().tolist() == [
        [1, 0, 0, 0, 0],
        [0, 1, 0, 0, 0],
        [1, 0, 1, 0, 0],
        [1, 0, 0, 1, 0],
        [1, 0, 1, 0, 1],
    ]
    assert tree.retrieve_indices.tolist() == [[1, -1, -1], [0, 3, -1], [0, 2, 4]]  # one row per leaf 1, 3, 4


def test_verify_pass_layout_puts_the_pending_token_first():
    tree = TreeSpec.from_paths(PATHS)
    assert tree.verify_positions().tolist() == [0, 1, 1, 2, 2, 3]
    assert tree.verify_mask().int().tolist() == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0],
        [1, 1, 0, 1, 0, 0],
        [1, 1, 0, 0, 1, 0],
        [1, 1, 0, 1, 0, 1],
    ]


def test_path_order_does_not_matter_and_parents_give_the_same_tree():
    a = TreeSpec.from_paths(PATHS)
    b = TreeSpec.from_paths(list(reversed(PATHS)))
    c = TreeSpec.from_parents([-1, -1, 0, 0, 2])
    for other in (b, c):
        for name in ("parents", "depth", "ranks", "ancestor_mask", "position_offsets", "retrieve_indices"):
            assert torch.equal(getattr(a, name), getattr(other, name)), name


def test_a_chain_is_the_one_path_tree():
    tree = TreeSpec.chain(4)
    assert tree.parents.tolist() == [-1, 0, 1, 2]
    assert tree.retrieve_indices.tolist() == [[0, 1, 2, 3]]
    assert torch.equal(tree.ancestor_mask, torch.ones(4, 4, dtype=torch.bool).tril())
    assert tree.verify_positions().tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    "paths, message",
    [
        ([], "at least one path"),
        ([(0,), ()], "non-empty tuple"),
        ([(0,), "01"], "non-empty tuple"),
        ([(0,), (0, -1)], "integer child ranks"),
        ([(0,), (0, 1.5)], "integer child ranks"),
        ([(0,), (0,)], "duplicate"),
        ([(0,), (0, 0, 0)], "no parent path"),
        ([(0,), (2,)], "skip a child rank"),
        ([(0,), (0, 1)], "skip a child rank"),
    ],
)
def test_malformed_paths_are_refused(paths, message):
    with pytest.raises(DraftVerifyError, match=message):
        TreeSpec.from_paths(paths)


@pytest.mark.parametrize("parents", [[], [0], [-1, 1], [-1, 2, 0], [-2]])
def test_malformed_parents_are_refused(parents):
    with pytest.raises(DraftVerifyError):
        TreeSpec.from_parents(parents)


def test_draft_checks_its_tree_size():
    with pytest.raises(DraftVerifyError, match="5 nodes"):
        Draft(tokens=torch.zeros(1, 4, dtype=torch.long), tree=TreeSpec.from_paths(PATHS))
    draft = Draft(tokens=torch.zeros(1, 5, dtype=torch.long), tree=TreeSpec.from_paths(PATHS))
    assert draft.length == 5 and draft.depth == 3
    assert Draft(tokens=torch.zeros(1, 4, dtype=torch.long)).depth == 4


def test_make_verdict_names_the_kept_chain_positions():
    verdict = make_verdict(torch.tensor([[7, 8, 9], [4, 5, 6]]), torch.tensor([2, 0]), torch.tensor([1, 2]))
    assert verdict.tokens.tolist() == [[7, 8, 1, -1], [2, -1, -1, -1]]
    assert verdict.path.tolist() == [[0, 1, -1], [-1, -1, -1]]


def test_each_row_of_a_batch_tree_can_accept_as_deep_as_its_own_nodes():
    """Rows on one shape (tree.row_trees) propose different nodes: a row's depth is its own deepest node, so a row
    whose shallow trie was all accepted is not counted as rejected (the loop's rejections)."""
    from draftverify.tree import row_trees

    spec, tokens, valid = row_trees([([7, 8, 9], [-1, 0, 1]), ([4, 5], [-1, -1]), ([], [])])
    draft = Draft(tokens=tokens, tree=spec, valid=valid)
    assert draft.depth == 3 and draft.row_depths(3) == [3, 1, 0]
    assert Draft(tokens=tokens[:1], tree=spec).row_depths(1) == [3]
    chain = Draft(tokens=torch.tensor([[1, 2, 3], [4, 5, 0]]), lengths=torch.tensor([3, 2]))
    assert chain.row_depths(2) == [3, 2] and Draft(tokens=torch.tensor([[1, 2]])).row_depths(1) == [2]

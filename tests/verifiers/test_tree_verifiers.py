"""Tree verification on hand-drawn trees with hand-picked target choices, and the exact verifier's dispatch.

Tree (node: path): 0 (0,), 1 (1,), 2 (0, 0), 3 (0, 1), 4 (0, 0, 0). choice[:, 0] is the target's argmax at
the pending token, choice[:, 1 + j] its argmax after node j.
"""

from __future__ import annotations

import pytest
import torch

from draftverify.errors import DraftVerifyError
from draftverify.methods import MethodOptions, build_verifier
from draftverify.tree import TreeSpec
from draftverify.types import Draft, SamplingParams
from draftverify.verifiers import GreedyVerifier, SpeculativeSamplingVerifier, TreeGreedyVerifier
from draftverify.verifiers.tree import tree_greedy, tree_speculative_sample

TREE = TreeSpec.from_paths([(0,), (1,), (0, 0), (0, 1), (0, 0, 0)])
TOKENS = torch.tensor([[10, 11, 20, 21, 30]])


def _choice(root: int, after: list[int]) -> torch.Tensor:
    return torch.tensor([[root] + after])


@pytest.mark.parametrize(
    "choice, path, emitted",
    [
        (_choice(10, [20, 99, 30, 99, 40]), [0, 2, 4], [10, 20, 30, 40]),  # the whole deepest branch + bonus
        (_choice(11, [20, 50, 30, 99, 40]), [1], [11, 50]),  # second root child, then the target's token
        (_choice(10, [21, 99, 30, 77, 40]), [0, 3], [10, 21, 77]),  # the sibling (0, 1) wins at depth 2
        (_choice(10, [20, 99, 31, 99, 40]), [0, 2], [10, 20, 31]),  # rejected at depth 3: target's token instead
        (_choice(12, [20, 99, 30, 99, 40]), [], [12]),  # nothing accepted
    ],
    ids=["deepest", "second-root", "sibling", "depth-3-reject", "none"],
)
def test_tree_greedy_on_a_hand_drawn_tree(choice, path, emitted):
    verdict = tree_greedy(TOKENS, TREE, choice)
    n = len(path)
    assert verdict.num_accepted.tolist() == [n]
    assert verdict.path.tolist() == [path + [-1] * (TREE.size - n)]
    assert verdict.tokens.tolist() == [emitted + [-1] * (TREE.size + 1 - len(emitted))]


def test_tree_greedy_rows_are_independent():
    tokens = torch.cat([TOKENS, TOKENS])
    choice = torch.cat([_choice(10, [20, 99, 30, 99, 40]), _choice(11, [20, 50, 30, 99, 40])])
    verdict = tree_greedy(tokens, TREE, choice)
    assert verdict.num_accepted.tolist() == [3, 1]
    assert verdict.tokens[:, :4].tolist() == [[10, 20, 30, 40], [11, 50, -1, -1]]


def test_tree_greedy_verifier_reads_logits_and_needs_a_tree():
    logits = torch.full((1, 6, 100), -5.0)
    for i, token in enumerate([10, 20, 99, 31, 99, 40]):
        logits[0, i, token] = 5.0
    verdict = TreeGreedyVerifier().verify(Draft(TOKENS, tree=TREE), logits, SamplingParams(), None)
    assert verdict.tokens[0, :3].tolist() == [10, 20, 31]
    with pytest.raises(DraftVerifyError, match="needs a tree"):
        TreeGreedyVerifier().verify(Draft(TOKENS), logits, SamplingParams(), None)
    with pytest.raises(DraftVerifyError, match="temperature 0"):
        TreeGreedyVerifier().check_params(SamplingParams(temperature=1.0))


def test_exact_dispatches_on_draft_shape_and_temperature():
    greedy = build_verifier("exact", SamplingParams(), MethodOptions())
    sampled = build_verifier("exact", SamplingParams(temperature=1.0), MethodOptions())
    assert isinstance(greedy.chain, GreedyVerifier) and isinstance(greedy.tree, TreeGreedyVerifier)
    assert isinstance(sampled.chain, SpeculativeSamplingVerifier)
    assert greedy.accepts_trees and greedy.lossless
    logits = torch.zeros(1, 6, 100)
    logits[0, :, 10] = 1.0  # argmax 10 everywhere: chain keeps draft[0] = 10, tree keeps node 0 only
    chain = greedy.verify(Draft(TOKENS), logits, SamplingParams(), None)
    tree = greedy.verify(Draft(TOKENS, tree=TREE), logits, SamplingParams(), None)
    assert chain.num_accepted.tolist() == [1] and tree.num_accepted.tolist() == [1]
    assert tree.path[0, :1].tolist() == [0]
    lenient = build_verifier("exact", SamplingParams(), MethodOptions(lenience=0.5))
    with pytest.raises(DraftVerifyError, match="lenience"):
        lenient.verify(Draft(TOKENS, tree=TREE), logits, SamplingParams(), None)


@pytest.mark.skipif(tree_speculative_sample is not None, reason="tree sampling is merged: its own tests apply")
def test_sampling_on_trees_says_it_is_unavailable():
    sampled = build_verifier("exact", SamplingParams(temperature=1.0), MethodOptions())
    with pytest.raises(DraftVerifyError, match="not available"):
        sampled.verify(Draft(TOKENS, tree=TREE), torch.zeros(1, 6, 100), SamplingParams(temperature=1.0), None)

"""prompt_lookup_tree: several earlier matches merged into one trie; exact, at least as good as its chain twin."""

from __future__ import annotations

import pytest
import torch

from conftest import CAUSAL_ARCHS, reference_greedy, varied_model
from draftverify import DraftVerifyError, SamplingParams, generate
from draftverify.drafters import PromptLookupDrafter, PromptLookupTreeDrafter
from draftverify.drafters.prompt_lookup_tree import find_continuations, trie
from draftverify.methods import MethodOptions, build_verifier
from draftverify.types import DecodingState

torch.set_num_threads(1)


def test_find_continuations_latest_first_longest_ngram_first():
    #                       0  1  2  3  4  5  6  7  8  9 10 11 12
    haystack = [7, 1, 2, 9, 1, 2, 8, 3, 2, 5, 6, 1, 2]
    # pattern "1 2" occurs at 1 and 4 -> continuations after 4 (latest) first; then n=1 "2" adds after 8
    assert find_continuations(haystack, 2, 1, 2, limit=4) == [[8, 3], [9, 1], [5, 6]]
    assert find_continuations(haystack, 2, 1, 2, limit=1) == [[8, 3]]
    assert find_continuations([4, 5, 6], 2, 1, 3, limit=4) == []


def test_trie_merges_shared_prefixes():
    tokens, parents = trie([[8, 3, 4], [8, 5], [9]])
    assert tokens == [8, 3, 4, 5, 9]
    assert parents == [-1, 0, 1, 0, -1]


def test_propose_builds_the_tree():
    state = DecodingState(torch.tensor([[7, 1, 2, 9, 1, 2, 8, 3, 2, 5, 6, 1, 2]]), None, 3, SamplingParams(), None)
    draft = PromptLookupTreeDrafter(max_ngram=2, num_matches=3).propose(state, 2)
    # the matches [8, 3], [9, 1], [5, 6] as one trie, nodes by depth then sibling rank (tree.row_trees)
    assert draft.tokens.tolist() == [[8, 9, 5, 3, 1, 6]]
    assert draft.tree.parents.tolist() == [-1, -1, -1, 0, 1, 2] and draft.valid is None
    empty = PromptLookupTreeDrafter().propose(
        DecodingState(torch.tensor([[4, 5, 6]]), None, 3, SamplingParams(), None), 4
    )
    assert empty.length == 0 and empty.tree is None


PROMPT = torch.tensor([[5, 17, 33, 8, 41, 5, 17, 60, 5, 17, 33, 9, 5, 17, 60, 2, 5, 17]])  # "5 17" continues 3 ways
NEW = 40


@pytest.mark.parametrize("arch", CAUSAL_ARCHS)
def test_prompt_lookup_tree_equals_target_greedy_and_beats_its_chain_twin(arch):
    model = varied_model(arch)
    ref = reference_greedy(model, PROMPT, NEW)
    verifier = build_verifier("exact", SamplingParams(), MethodOptions())
    tree = generate(model, PromptLookupTreeDrafter(), verifier, PROMPT, max_new_tokens=NEW, gamma=4)
    chain = generate(model, PromptLookupDrafter(), verifier, PROMPT, max_new_tokens=NEW, gamma=4)
    assert tree.new_tokens[0].tolist() == ref == chain.new_tokens[0].tolist()
    assert tree.stats.tokens_per_call >= chain.stats.tokens_per_call
    assert tree.stats.tokens_per_call > 1.0


def test_bad_options_and_encoder_decoder_targets_are_refused():
    with pytest.raises(DraftVerifyError, match="num_matches"):
        PromptLookupTreeDrafter(num_matches=0)
    verifier = build_verifier("exact", SamplingParams(), MethodOptions())
    with pytest.raises(DraftVerifyError, match="position_ids"):
        generate(varied_model("t5"), PromptLookupTreeDrafter(), verifier, PROMPT, max_new_tokens=4)

"""Prompt lookup / copy drafter (Leviathan section 4): continue the latest earlier match of the final n-gram."""

from __future__ import annotations

import pytest
import torch

from draftverify.drafters import PromptLookupDrafter
from draftverify.drafters.prompt_lookup import find_continuation
from draftverify.errors import DraftVerifyError
from draftverify.types import DecodingState, SamplingParams

torch.set_num_threads(1)


def cont(haystack, max_ngram=3, min_ngram=1, gamma=5) -> list[int]:
    return find_continuation(list(haystack), max_ngram, min_ngram, gamma)


def state(tokens: list[int], source: list[int] | None = None) -> DecodingState:
    return DecodingState(
        tokens=torch.tensor([tokens]),
        source_ids=torch.tensor([source]) if source is not None else None,
        prompt_length=len(tokens),
        params=SamplingParams(),
        generator=None,
    )


# ---------------------------------------------------------------- find_continuation


def test_picks_latest_earlier_match():
    # [1, 2] occurs at 0 (followed by 9) and at 3 (followed by 8); the latest earlier one wins
    assert cont([1, 2, 9, 1, 2, 8, 5, 1, 2], max_ngram=2, min_ngram=2, gamma=2) == [8, 5]
    # unigram: the latest earlier 7 is followed by 4
    assert cont([7, 1, 7, 4, 6, 7], max_ngram=1, gamma=1) == [4]


# trigram [4,1,2] only at 0 (-> 7); bigram [1,2] latest at 5 (-> 8); unigram [2] latest at 9 (-> 6)
LAYERED = [4, 1, 2, 7, 9, 1, 2, 8, 3, 2, 6, 4, 1, 2]


@pytest.mark.parametrize("max_ngram, first", [(3, 7), (4, 7), (2, 8), (1, 6)])
def test_prefers_longest_ngram(max_ngram, first):
    assert cont(LAYERED, max_ngram=max_ngram, min_ngram=1, gamma=1) == [first]


def test_min_ngram_bounds_backoff():
    # only a unigram match exists ([2] -> 5); min_ngram=2 forbids it
    haystack = [2, 5, 6, 1, 2]
    assert cont(haystack, max_ngram=3, min_ngram=1, gamma=1) == [5]
    assert cont(haystack, max_ngram=3, min_ngram=2, gamma=1) == []


def test_returns_at_most_gamma_tokens():
    haystack = [1, 2, 3, 4, 5, 6, 7, 1, 2]
    assert cont(haystack, max_ngram=2, gamma=3) == [3, 4, 5]
    assert cont(haystack, max_ngram=2, gamma=1) == [3]
    # fewer than gamma tokens follow the match: return what there is (the continuation may run into the pattern)
    assert cont([5, 8, 9, 5], max_ngram=1, gamma=10) == [8, 9, 5]
    assert find_continuation(haystack, 2, 1, 0) == []


def test_never_matches_final_ngram_against_itself():
    # the final n-gram appears nowhere else: no match, even though it trivially matches itself
    assert cont([1, 2, 3], max_ngram=3, gamma=4) == []
    assert cont([9], max_ngram=1, gamma=4) == []
    # overlapping occurrences are fine as long as the match starts earlier
    assert cont([7, 7, 7], max_ngram=2, min_ngram=2, gamma=4) == [7]
    assert cont([5, 5], max_ngram=1, gamma=4) == [5]


def test_haystack_shorter_than_ngram_is_skipped():
    # n=3 cannot fit a pattern plus an earlier window in 3 tokens; falls back to the unigram match
    assert cont([4, 6, 4], max_ngram=3, gamma=2) == [6, 4]


def test_empty_when_nothing_matches():
    assert find_continuation([1, 2, 3, 4, 5], 3, 1, 4) == []


# ---------------------------------------------------------------- PromptLookupDrafter


def test_drafter_decoder_only_copies_from_context():
    drafter = PromptLookupDrafter(max_ngram=2)
    draft = drafter.propose(state([1, 2, 3, 4, 9, 1, 2]), gamma=2)
    assert draft.tokens.tolist() == [[3, 4]]
    assert draft.q_probs is None  # deterministic proposal
    assert drafter.forward_calls == 0


def test_drafter_empty_draft_has_batch_shape():
    draft = PromptLookupDrafter().propose(state([1, 2, 3]), gamma=4)
    assert draft.tokens.shape == (1, 0) and draft.length == 0


def test_drafter_searches_source_for_encoder_decoder():
    source = [10, 11, 12, 13, 14]
    tokens = [0, 11, 12]  # decoder start token, then a copy of the source begins
    drafter = PromptLookupDrafter(max_ngram=2)
    draft = drafter.propose(state(tokens, source), gamma=2)
    assert draft.tokens.tolist() == [[13, 14]]
    # without the source there is nothing to copy from
    assert drafter.propose(state(tokens), gamma=2).length == 0


def test_drafter_prefers_latest_match_in_decoder_tokens_over_source():
    # the source is searched first in the haystack, so a later match in the decoder tokens wins
    source = [11, 12, 13]
    tokens = [0, 11, 12, 20, 11, 12]
    draft = PromptLookupDrafter(max_ngram=2).propose(state(tokens, source), gamma=1)
    assert draft.tokens.tolist() == [[20]]


@pytest.mark.parametrize("max_ngram, min_ngram", [(2, 3), (1, 0), (3, 0), (0, 0), (3, -1)])
def test_rejects_bad_ngram_bounds(max_ngram, min_ngram):
    with pytest.raises(DraftVerifyError, match="min_ngram"):
        PromptLookupDrafter(max_ngram=max_ngram, min_ngram=min_ngram)


def test_accepts_equal_bounds():
    drafter = PromptLookupDrafter(max_ngram=2, min_ngram=2)
    assert (drafter.max_ngram, drafter.min_ngram) == (2, 2)

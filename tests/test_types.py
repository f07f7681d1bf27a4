"""types.py: a Verdict read as tensors or as host lists, and a DecodingState whose appended tokens wait as host
ints until someone reads its tensors."""

from __future__ import annotations

import pytest
import torch

from draftverify.errors import DraftVerifyError
from draftverify.types import DecodingState, Draft, SamplingParams, Verdict, append_rows, left_padded
from draftverify.verifiers.base import make_verdict


def test_a_verdict_from_lists_gives_the_tensors_make_verdict_gives():
    draft = torch.tensor([[5, 6, 7], [5, 9, 7]])
    want = make_verdict(draft, torch.tensor([3, 1]), torch.tensor([8, 4]))
    got = Verdict.of_chain([[5, 6, 7, 8], [5, 4, -1, -1]], [3, 1])
    for field in ("tokens", "num_accepted", "path"):
        assert torch.equal(getattr(got, field), getattr(want, field)), field
    assert want.rows == got.rows and want.accepted == got.accepted == [3, 1]


def test_a_verdict_of_an_empty_draft_has_an_empty_path():
    got = Verdict.of_chain([[4], [2]], [0, 0])
    assert got.path.shape == (2, 0) and got.tokens.tolist() == [[4], [2]]


def test_a_verdict_needs_its_three_tensors():
    with pytest.raises(DraftVerifyError, match="of_chain"):
        Verdict(tokens=torch.tensor([[1]]))


def test_appended_tokens_join_the_tensors_when_read_as_append_rows_would():
    tokens, lengths = torch.tensor([[0, 1, 2], [3, 4, 5]]), torch.tensor([2, 3])
    state = DecodingState(tokens, None, 3, SamplingParams(), None, lengths=lengths)
    steps = [[[7], [8]], [[9, 10], [11, 12]], [[], []], [[13], [14, 15, 16]], [[1, 2], [3, 4]]]
    want_tokens, want_lengths = tokens, lengths
    for emitted in steps:
        state.append(emitted)
        want_tokens, want_lengths = append_rows(want_tokens, want_lengths, emitted)
        assert state.last_tokens() == want_tokens[:, -1].tolist()
        assert torch.equal(state.pending_column(), want_tokens[:, -1:])
    assert torch.equal(state.tokens, want_tokens) and torch.equal(state.lengths, want_lengths)
    assert state.row(0).tolist() == [1, 2, 7, 9, 10, 13, 1, 2]


def test_setting_the_tokens_keeps_what_was_appended_before():
    state = DecodingState(torch.tensor([[1, 2]]), None, 2, SamplingParams(), None)
    state.append([[3]])
    state.tokens = state.tokens.clone()  # what the scheduler does when rows leave: it reads, then writes
    state.append([[4]])
    assert state.tokens.tolist() == [[1, 2, 3, 4]] and state.lengths.tolist() == [4]
    assert state.batch_size == 1 and state.next_position().tolist() == [4]


def test_row_ids_follow_every_append_and_start_again_after_a_write():
    state = DecodingState(torch.tensor([[0, 1, 2], [3, 4, 5]]), None, 3, SamplingParams(), None, torch.tensor([2, 3]))
    assert state.row_ids(0) == [1, 2] and state.row_ids(1) == [3, 4, 5]
    state.append([[6], [7]])
    state.append([[8, 9], []])  # ragged: joined into the tensors now
    assert state.row_ids(0) == [1, 2, 6, 8, 9] and state.row_ids(1) == [3, 4, 5, 7]
    assert [state.row(b).tolist() for b in range(2)] == [state.row_ids(0), state.row_ids(1)]
    state.tokens, state.lengths = state.tokens[1:], state.lengths[1:]  # a row left
    assert state.row_ids(0) == [3, 4, 5, 7]


def test_a_draft_of_host_rows_pads_them_and_keeps_them():
    ragged = Draft.of_rows([[4, 5, 6], [7]])
    assert ragged.tokens.tolist() == [[4, 5, 6], [7, 0, 0]] and ragged.lengths.tolist() == [3, 1]
    assert ragged.rows == [[4, 5, 6], [7, 0, 0]]
    even = Draft.of_rows([[1, 2], [3, 4]])
    assert even.lengths is None and even.rows == even.tokens.tolist()


def test_left_padded_rows_end_in_the_last_column_with_the_mask_false_at_the_padding():
    ids, mask = left_padded([[5, 6, 7], (8,)], pad=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert ids.dtype == torch.int64
    assert mask.tolist() == [[True, True, True], [False, False, True]]

"""The scheduler: rows emitting, ending, leaving and joining (typed RowRequests), and the left-padded token rows."""

from __future__ import annotations

import pytest
import torch

from draftverify import DraftVerifyError, RowRequest, SamplingParams
from draftverify.drafters.base import NoDrafter
from draftverify.engine.processors import FirstTokenAllowed, Processors
from draftverify.engine.scheduler import Scheduler, checked_requests, row_generator
from draftverify.sampling import RowParams
from draftverify.types import DecodingState, append_rows, trim_rows

VOCAB = 50


class RecordingTarget:
    """The row calls of a backend, recorded."""

    vocab_size = VOCAB

    def __init__(self):
        self.calls = []

    def check_fits(self, positions):
        self.calls.append(("check_fits", positions))

    def drop_rows(self, keep):
        self.calls.append(("drop_rows", keep.tolist()))

    def join_rows(self, ids, mask):
        self.calls.append(("join_rows", ids.tolist(), mask.tolist()))


def state_of(rows: list[list[int]], params=SamplingParams(), seeds=None) -> DecodingState:
    width = max(len(r) for r in rows)
    tokens = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    return DecodingState(
        tokens=tokens,
        source_ids=None,
        prompt_length=width,
        params=params,
        generator=None,
        lengths=torch.tensor([len(r) for r in rows]),
        seeds=seeds,
    )


def processors(rows: int = 0) -> Processors:
    """The processors of `rows` rows without processing."""
    made = Processors(VOCAB, set(), torch.device("cpu"))
    made.add(made.check(None, None, rows), [[1]] * rows)
    return made


def test_rows_emit_until_their_eos_or_limit():
    rows = Scheduler([3, 5], [[1], [2]], [{9}, {9}])
    assert rows.most_remaining() == 5
    emitted = rows.emitted([[4, 9, 6], [7, 8, -1]], [2, 1])
    assert emitted == [[4, 9], [7, 8]] and rows.ended == [True, False]  # row 0 stops at its EOS
    rows = Scheduler([2], [[1]], [set()])
    assert rows.emitted([[4, 5, 6]], [2]) == [[4, 5]] and rows.ended == [True]  # cut at the limit
    grid = Scheduler([4, 4], [[1], [2]], [set(), set()])
    step = grid.emitted([[4, 5], [6, -1]], [1, 0])
    assert grid.padded(step, "cpu").tolist() == [[4, 5], [6, -1]]


def test_each_row_stops_at_its_own_stop_tokens():
    rows = Scheduler([5, 5], [[1], [2]], [{7}, {9, 8}])  # row 0 ignores EOS 9; row 1 also stops at 8
    assert rows.emitted([[9, 7, 6], [8, 9, 6]], [2, 2]) == [[9, 7], [8]] and rows.ended == [True, True]


def test_ended_and_stopped_rows_leave_the_target_the_drafter_and_the_state():
    target = RecordingTarget()
    rows = Scheduler([4, 4, 4], [[1, 2], [3], [4, 5, 6]], [{9}] * 3)
    params = RowParams([SamplingParams(), SamplingParams(temperature=1.0), SamplingParams(temperature=0.5)])
    state = state_of([[1, 2], [3], [4, 5, 6]], params, seeds=[10, 11, 12])
    kept = processors(3)
    rows.emitted([[7], [8], [9]], [0, 0, 0])  # row 2 ends at its EOS
    rows.leave(None, target, NoDrafter(), state, kept)
    assert rows.active == [0, 1] and target.calls == [("drop_rows", [True, True, False])]
    assert state.tokens.tolist() == [[1, 2], [0, 3]] and state.lengths.tolist() == [2, 1]  # the padding column went
    assert state.seeds == [10, 11] and [p.temperature for p in state.params.rows] == [0.0, 1.0]
    rows.leave([1], target, NoDrafter(), state, kept)  # the caller stops row 1 (an original index)
    assert rows.active == [0] and state.tokens.tolist() == [[1, 2]]
    assert state.params == SamplingParams()  # one setting left: a plain SamplingParams again
    rows.leave([0], target, NoDrafter(), state, kept)  # the last row: the generation is over, nothing is dropped
    assert rows.active == [] and len(target.calls) == 2 and kept.rows == 1


def test_rows_join_with_their_own_limits_seeds_settings_and_first_tokens():
    target = RecordingTarget()
    rows = Scheduler([4], [[1, 2, 3]], [set()])
    state = state_of([[1, 2, 3]], SamplingParams(temperature=1.0, seed=5), seeds=[5])
    joined_to = processors(1)
    mine = SamplingParams(temperature=0.5)
    joined = rows.join(
        [
            RowRequest([7], 2, seed=9, first_token_allowed=[3, 4]),
            RowRequest(torch.tensor([8, 9, 10, 11]), 6, params=mine),
        ],
        target,
        NoDrafter(),
        state,
        joined_to,
    )
    first = next(p for p in joined_to.present if isinstance(p, FirstTokenAllowed))
    assert joined == 5 and rows.active == [0, 1, 2] and rows.limits == [4, 2, 6]
    assert target.calls[:2] == [("check_fits", 3), ("check_fits", 10)]
    assert target.calls[2] == (
        "join_rows",
        [[0, 0, 0, 7], [8, 9, 10, 11]],
        [[False, False, False, True], [True, True, True, True]],
    )
    assert state.tokens.tolist() == [[0, 1, 2, 3], [0, 0, 0, 7], [8, 9, 10, 11]]
    assert state.lengths.tolist() == [3, 1, 4]
    assert state.seeds[:2] == [5, 9] and isinstance(state.seeds[2], int)  # no seed given: a fresh one
    assert [p.temperature for p in state.params.rows] == [1.0, 1.0, 0.5]  # no settings: the first row's
    assert [None if a is None else a.tolist() for a in first.rows] == [None, [3, 4], None]
    out = rows.output(torch.zeros(1, 3, dtype=torch.long), stats=None)
    assert out.sequences.tolist() == [[1, 2, 3, -1], [7, -1, -1, -1], [8, 9, 10, 11]]


def test_admit_returns_typed_row_requests():
    assert checked_requests(None) == [] and checked_requests([]) == []
    with pytest.raises(DraftVerifyError, match="admit\\(\\) must return a list of RowRequest, got tuple"):
        checked_requests([([1, 2], 4, None)])
    rows = Scheduler([4], [[1]], [set()])
    with pytest.raises(DraftVerifyError, match="RowRequest"):
        rows.join([([5], 3)], RecordingTarget(), NoDrafter(), state_of([[1]]), processors(1))
    with pytest.raises(DraftVerifyError, match="must be in"):  # checked before anything joins
        rows.join(
            [RowRequest([5], 3, first_token_allowed=[VOCAB])],
            RecordingTarget(),
            NoDrafter(),
            state_of([[1]]),
            processors(1),
        )
    assert rows.active == [0]


@pytest.mark.parametrize(
    "fields, message",
    [
        (([], 3), "at least one prompt token"),
        (([1, 2.5], 3), "list of token ids"),
        (("abc", 3), "list of token ids"),
        (([True], 3), "list of token ids"),
        (([1], 0), "max_new_tokens must be an integer >= 1"),
        (([1], 2.0), "max_new_tokens must be an integer >= 1"),
        (([1], 2, "7"), "seed must be an integer"),
    ],
)
def test_a_bad_row_request_is_refused(fields, message):
    with pytest.raises(DraftVerifyError, match=message):
        RowRequest(*fields)
    with pytest.raises(DraftVerifyError, match="params must be a SamplingParams"):
        RowRequest([1], 2, params={"temperature": 1.0})


def test_left_padded_rows_grow_by_what_each_emits():
    tokens, lengths = torch.tensor([[0, 1, 2], [3, 4, 5]]), torch.tensor([2, 3])
    same, same_lengths = append_rows(tokens, lengths, [[6], [7]])
    assert same.tolist() == [[0, 1, 2, 6], [3, 4, 5, 7]] and same_lengths.tolist() == [3, 4]
    ragged, ragged_lengths = append_rows(tokens, lengths, [[6, 7], []])
    assert ragged.tolist() == [[1, 2, 6, 7], [0, 3, 4, 5]]  # row 1 moved by nothing, one padding column cut
    assert ragged_lengths.tolist() == [4, 3]
    trimmed, _ = trim_rows(torch.tensor([[0, 0, 1], [0, 2, 3]]), torch.tensor([1, 2]))
    assert trimmed.tolist() == [[0, 1], [2, 3]]


def test_generators_are_made_when_a_row_may_sample():
    assert row_generator(SamplingParams(), 2, None, joins=False, device=torch.device("cpu")) == (None, None)
    generator, seeds = row_generator(SamplingParams(), 2, [3, None], joins=True, device=torch.device("cpu"))
    assert generator is not None and seeds[0] == 3 and isinstance(seeds[1], int)
    seeded = RowParams([SamplingParams(temperature=1.0, seed=4), SamplingParams(temperature=0.5, seed=6)])
    one, seeds = row_generator(seeded, 2, None, joins=False, device=torch.device("cpu"))
    two, _ = row_generator(seeded, 2, None, joins=False, device=torch.device("cpu"))
    assert seeds == [4, 6] and torch.equal(torch.rand(3, generator=one), torch.rand(3, generator=two))

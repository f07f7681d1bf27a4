"""The stats recorder: GenerationStats from one StepRecord per step (made when read, added up at the end)."""

from __future__ import annotations

import torch

from draftverify.draft_length import DraftLength
from draftverify.drafters.base import NoDrafter
from draftverify.engine.stats import FOLD_STEPS, StatsRecorder, inform_policy
from draftverify.tree import TreeSpec
from draftverify.types import Draft


class CountingDrafter(NoDrafter):
    def timers(self):
        return {"retokenize": float(self.forward_calls)}


def chain(batch: int, n: int, lengths: list[int] | None = None) -> Draft:
    return Draft(
        tokens=torch.zeros(batch, n, dtype=torch.long), lengths=None if lengths is None else torch.tensor(lengths)
    )


def record_of(draft, accepted, emitted, gamma, rows, times, prefill=False, verify_target_s=None):
    """One step's record, from a recorder whose first step is the prefill's when `prefill`."""
    recorder = StatsRecorder(NoDrafter(), prompt_tokens=1, started=0.0, carries_prefill=prefill)
    recorder.step(draft, accepted, emitted, gamma, rows, times, verify_target_s)
    return recorder.record()


def test_a_step_record_adds_up_its_rows():
    # two rows, chain of 3: row 0 accepts 3 but EOS cuts it after 2 tokens; row 1 is rejected at its first draft
    times = (0.0, 1.0, 3.0, 6.0)
    record = record_of(chain(2, 3), [3, 0], [[7, 8], [9]], gamma=3, rows=2, times=times, prefill=False)
    assert (record.drafted, record.emitted_accepted, record.rejections, record.new_tokens) == (6, 2, 1, 3)
    assert (record.draft_s, record.target_s, record.verify_s) == (1.0, 2.0, 3.0)
    assert (record.row_drafted, record.row_kept, record.row_emitted) == ([3, 3], [2, 0], [2, 1])  # the server's usage
    ragged = record_of(chain(2, 3, [3, 1]), [1, 1], [[1, 2], [3, 4]], 3, 2, (0, 0, 0, 0), False)
    assert ragged.drafted == 4 and ragged.rejections == 1 and ragged.depths == [3, 1] and ragged.row_drafted == [3, 1]
    tree = TreeSpec.from_paths([(0,), (1,), (0, 0)])
    valid = torch.tensor([[True, True, True], [True, False, False]])
    trees = record_of(
        Draft(tokens=torch.zeros(2, 3, dtype=torch.long), tree=tree, valid=valid),
        [2, 1],
        [[1, 2, 3], [4, 5]],
        3,
        2,
        (0, 0, 0, 0),
        False,
    )
    assert trees.drafted == 4 and trees.depths == [2, 1] and trees.rejections == 0
    assert trees.row_drafted == [3, 1] and trees.row_kept == [2, 1]


def test_a_rescored_step_counts_its_second_target_forward():
    # verifying scored the kept branch again (Verdict.target_s, 1.5 of its 2 seconds): target time and a call
    record = record_of(chain(1, 3), [2], [[1, 2, 3]], 3, 1, (0.0, 1.0, 3.0, 5.0), False, verify_target_s=1.5)
    assert (record.target_s, record.verify_s, record.target_calls) == (3.5, 0.5, 2)
    recorder = StatsRecorder(CountingDrafter(), prompt_tokens=1, started=0.0)
    recorder.step(chain(1, 3), [2], [[1, 2, 3]], 3, 1, (0.0, 1.0, 3.0, 5.0), verify_target_s=1.5)
    recorder.step(chain(1, 3), [0], [[4]], 3, 1, (5.0, 5.5, 6.0, 6.5))
    assert recorder.finish().target_calls == 3


def test_the_recorder_builds_generation_stats():
    drafter = CountingDrafter()
    recorder = StatsRecorder(drafter, prompt_tokens=10, started=0.0)
    assert recorder.stats.time_prefill > 0  # the prefill's time, counted from `started`
    drafter.forward_calls += 2
    recorder.step(chain(1, 2), [2], [[1, 2, 3]], 2, 1, (0.0, 0.5, 1.5, 1.75))
    recorder.step(chain(1, 2), [0], [[4]], 2, 1, (2.0, 2.25, 3.25, 3.5))
    recorder.joined(prompt_tokens=4, seconds=0.0)
    recorder.callback(1.0)
    stats = recorder.finish()
    assert (stats.prompt_tokens, stats.new_tokens, stats.target_calls) == (14, 4, 2)
    assert (stats.drafted_tokens, stats.accepted_tokens, stats.rejections) == (4, 2, 1)
    assert stats.gammas == [2, 2] and stats.chosen_gammas == [2, 2]
    assert (stats.time_draft, stats.time_target, stats.time_verify) == (0.75, 2.0, 0.5)
    assert stats.draft_calls == 2 and stats.time_retokenize == 2.0 and stats.prefill_steps == 0


def test_a_step_that_decoded_the_prompt_counts_as_prefill():
    drafter = CountingDrafter()
    recorder = StatsRecorder(drafter, prompt_tokens=5, started=0.0, carries_prefill=True)
    before = recorder.stats.time_prefill
    drafter.forward_calls += 3
    recorder.step(chain(1, 1), [1], [[1, 2]], 1, 1, (0.0, 1.0, 3.0, 3.5))
    first = recorder.record()
    recorder.step(chain(1, 1), [1], [[3, 4]], 1, 1, (4.0, 5.0, 7.0, 7.5))
    second = recorder.record()
    assert first.prefill and not second.prefill
    stats = recorder.finish()
    assert stats.prefill_steps == 1 and stats.prefill_draft_calls == 3
    assert stats.time_prefill == before + 3.0 and stats.time_draft == 1.0 and stats.time_target == 2.0


class Listening(DraftLength):
    def __init__(self):
        self.heard = []

    def next(self, rows=1):
        return 1

    def update(self, *args):
        self.heard.append(args)

    def update_rows(self, depths, accepted):
        self.heard.append((depths, accepted))


def test_the_length_policy_hears_batch_totals_and_no_prefill_times():
    policy = Listening()
    inform_policy(policy, record_of(chain(2, 2), [2, 1], [[1, 2, 3], [4, 5]], 2, 2, (0, 1, 3, 4), True))
    inform_policy(policy, record_of(chain(2, 2), [2, 1], [[1, 2, 3], [4, 5]], 2, 2, (0, 1, 3, 4), False))
    assert policy.heard == [(2, 3, 1, None, None, 2), ([2, 2], [2, 1]), (2, 3, 1, 1, 2, 2), ([2, 2], [2, 1])]


def test_a_step_after_rows_joined_on_a_deferring_backend_teaches_no_cost():
    # the joined rows' prompts ride on that step's forwards: its seconds are not a step's, yet its rows decoded
    drafter = CountingDrafter()
    recorder = StatsRecorder(drafter, prompt_tokens=5, started=0.0, carries_prefill=True)
    times = (0.0, 1.0, 3.0, 3.5)
    recorder.step(chain(1, 1), [1], [[1, 2]], 1, 1, times)
    first = recorder.record()
    recorder.step(chain(1, 1), [1], [[3, 4]], 1, 1, times)
    second = recorder.record()
    recorder.joined(prompt_tokens=4, seconds=0.0)
    recorder.step(chain(2, 1), [1, 1], [[5, 6], [7, 8]], 1, 2, times)
    third = recorder.record()
    recorder.step(chain(2, 1), [1, 1], [[9, 10], [11, 12]], 1, 2, times)
    fourth = recorder.record()
    assert [(r.prefill, r.timed) for r in (first, second, third, fourth)] == [
        (True, False),
        (False, True),
        (False, False),
        (False, True),
    ]
    stats = recorder.finish()
    assert stats.prefill_steps == 1 and stats.time_target == 3 * 2.0  # the join step's rows decoded: decode time
    policy = Listening()
    inform_policy(policy, third)
    assert policy.heard[0][3:5] == (None, None)


def test_rows_joining_a_backend_that_prefills_at_once_leave_the_next_step_timed():
    recorder = StatsRecorder(CountingDrafter(), prompt_tokens=5, started=0.0)
    recorder.joined(prompt_tokens=4, seconds=0.5)  # the prefill ran inside join, timed there
    recorder.step(chain(2, 1), [1, 1], [[5, 6], [7, 8]], 1, 2, (0.0, 1.0, 3.0, 3.5))
    record = recorder.record()
    assert record.timed and not record.prefill


def test_a_record_read_mid_generation_is_the_one_finish_adds_up():
    # the hot loop keeps each step's numbers only: what a reader gets then and the totals at the end agree
    recorder = StatsRecorder(CountingDrafter(), prompt_tokens=1, started=0.0)
    records = []
    for accepted, emitted in [([2], [[1, 2, 3]]), ([0], [[4]]), ([1], [[5, 6]])]:
        recorder.step(chain(1, 2), accepted, emitted, 2, 1, (0.0, 1.0, 3.0, 3.5))
        records.append(recorder.record())
    stats = recorder.finish()
    assert stats.new_tokens == sum(r.new_tokens for r in records) == 6
    assert stats.accepted_tokens == sum(r.emitted_accepted for r in records) == 3
    assert stats.rejections == sum(r.rejections for r in records) == 2
    assert [r.row_kept for r in records] == [[2], [0], [1]]


def test_a_long_generation_keeps_a_bounded_number_of_steps():
    # a served generation (continuous batching) lives as long as its batch: the kept steps are added up as they go
    recorder = StatsRecorder(CountingDrafter(), prompt_tokens=1, started=0.0)
    steps = 3 * FOLD_STEPS + 5
    for _ in range(steps):
        recorder.step(chain(1, 2), [1], [[1, 2]], 2, 1, (0.0, 1.0, 3.0, 3.5))
        assert recorder.record().new_tokens == 2
        assert len(recorder._steps) <= FOLD_STEPS
    stats = recorder.finish()
    assert (stats.new_tokens, stats.accepted_tokens, stats.rejections, len(stats.gammas)) == (
        2 * steps,
        steps,
        steps,
        steps,
    )

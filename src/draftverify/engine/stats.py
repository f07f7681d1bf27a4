"""GenerationStats built from one StepRecord per step, so the step's verbs only report what happened; the records are
made when read and added up at the end, not in the hot loop."""

from __future__ import annotations

from dataclasses import dataclass, field
from time import perf_counter

from ..draft_length import DraftLength
from ..drafters.base import Drafter, add_drafter_times
from ..types import Draft, GenerationStats, TokenLogprob

FOLD_STEPS = 256  # steps the recorder keeps before adding them up (a served generation lives as long as its batch)


@dataclass(slots=True)
class StepRecord:
    """What one step did: plain numbers summed over the step's rows, and the per-row lists the step made anyway."""

    gamma: int  # the length policy's choice (0: a plain decoding step)
    length: int  # the draft's length (tree nodes)
    rows: int  # rows the target scored
    depths: list[int]  # per row: most draft tokens it could accept
    accepted: list[int]  # per row: draft tokens the verifier accepted
    row_drafted: list[int]  # per row: draft tokens proposed (a tree: its nodes)
    row_kept: list[int]  # per row: accepted draft tokens that were emitted (a row's EOS or limit cuts the rest)
    row_emitted: list[int]  # per row: tokens emitted
    drafted: int  # draft tokens proposed, over rows
    emitted_accepted: int  # accepted draft tokens that were emitted (a row's EOS or limit cuts the rest)
    rejections: int  # rows that stopped at a rejected draft token
    new_tokens: int  # tokens emitted
    draft_s: float  # seconds proposing
    target_s: float  # seconds of the target's forward
    verify_s: float  # seconds of the verification rule
    prefill: bool  # this step's forward also decoded the prompt (backends/base.py defers_prefill)
    timed: bool  # its seconds are a step's cost, for the length policy: no prompt was decoded in its forwards
    target_calls: int  # target forwards: 1, or 2 when verifying scored the kept branch again (Verdict.target_s)
    # per row, the log-probabilities of its emitted tokens (None: it asked for none), when some row asked
    # (engine/logprobs.py); and of its prompt, on the step whose forward decoded a prompt whose logprobs were asked
    logprobs: list[list[TokenLogprob] | None] | None = field(default=None)
    prompt_logprobs: list[list[TokenLogprob] | None] | None = field(default=None)


def inform_policy(policy: DraftLength, record: StepRecord) -> None:
    """The length policy learns from the step (batch totals); the times of a step whose forwards also decoded a
    prompt are not a step's cost."""
    timed = record.timed
    policy.update(
        record.length,
        sum(record.accepted),
        record.rejections,
        record.draft_s if timed else None,
        record.target_s if timed else None,
        record.rows,
    )
    policy.update_rows(record.depths, record.accepted)


class StatsRecorder:
    """Adds up the step records of one generation, made right after the prefill (which it times from `started`);
    times outside the steps come through joined() and callback().

    carries_prefill: the first step's forward also decodes the prompt (backends/base.py defers_prefill), so its
    time is the prefill's; on such a backend the prompts of rows that join are decoded by the next step's forwards
    too, so that step's seconds do not teach the length policy a step's cost (its stats keep them: the other rows
    decoded in it)."""

    def __init__(self, drafter: Drafter, prompt_tokens: int, started: float, carries_prefill: bool = False):
        self.stats = GenerationStats(prompt_tokens=prompt_tokens, time_prefill=perf_counter() - started)
        self.drafter = drafter
        self.started = started
        self.carries_prefill = carries_prefill
        self.defers_prefill = carries_prefill  # joined rows' prompts, too, ride on the next step's forwards
        self.carries_joined = False  # the next step's forwards decode prompts of rows that joined
        self.calls_before = drafter.forward_calls  # the drafter's forwards in its start() are not the loop's
        self.timers_before = drafter.timers()  # a drafter's own timers (re-tokenizing), added at the end
        self.callback_seconds = 0.0  # the caller's streaming time is not the loop's: excluded from time_total
        # each step's numbers as step() kept them (gamma, length, rows, depths, row_drafted, accepted, emitted, times,
        # verify_target_s, prefill, timed, prefill_calls), until they are added up (_fold: at finish, or FOLD_STEPS)
        self._steps: list[tuple] = []

    def joined(self, prompt_tokens: int, seconds: float) -> None:
        """Rows joined between steps (continuous batching): their prefill is prefill time."""
        self.stats.prompt_tokens += prompt_tokens
        self.stats.time_prefill += seconds
        self.carries_joined = self.defers_prefill

    def callback(self, seconds: float) -> None:
        self.callback_seconds += seconds

    def step(
        self,
        draft: Draft,
        accepted: list[int],
        emitted: list[list[int]],
        gamma: int,
        rows: int,
        times: tuple[float, float, float, float],
        verify_target_s: float | None = None,
    ) -> None:
        """Keep a step that proposed `draft`, accepted `accepted` [B] and emitted `emitted` (per row), timed at the
        start, after proposing, after the target's forward and after verifying. verify_target_s: seconds of a second
        target forward that verifying ran (Verdict.target_s: a kept branch scored again), target time and a target
        call of their own; None: none. The step is the prefill's when its forwards also decoded the prompt
        (carries_prefill), and not timed (not a step's cost, for the length policy) when they decoded the prompts of
        rows that joined before it.

        Only the step's numbers are kept (one tuple; the lists are the step's own, not copied): its StepRecord is
        made when read (record()) and the totals are added up by finish(). Right after a llama.cpp forward every
        object a step touches is cold, so the hot loop does no bookkeeping it can leave to the end."""
        length = draft.length
        if draft.tree is None and draft.lengths is None:  # a chain every row drafted whole: the common step
            depths = row_drafted = None  # [length] per row, made when read
        else:
            depths = draft.row_depths(len(accepted))
            row_drafted = (
                depths
                if draft.lengths is not None
                else draft.valid.sum(dim=1).tolist()
                if draft.valid is not None
                else [length] * len(accepted)
            )
        if len(self._steps) >= FOLD_STEPS:  # a generation as long-lived as a server's keeps no more than this
            self._fold()
        prefill = self.carries_prefill
        prefill_calls = self.drafter.forward_calls if prefill else 0  # the drafter's forwards up to the prefill's end
        timed = not (prefill or self.carries_joined)
        self._steps.append(
            (
                gamma,
                length,
                rows,
                depths,
                row_drafted,
                accepted,
                emitted,
                times,
                verify_target_s,
                prefill,
                timed,
                prefill_calls,
            )
        )
        self.carries_prefill = self.carries_joined = False

    def record(self, step: int = -1) -> StepRecord:
        """The StepRecord of a kept step (the last one by default)."""
        gamma, length, rows, depths, row_drafted, accepted, emitted, times, again_s, prefill, timed, _ = self._steps[
            step
        ]
        if depths is None:
            depths = row_drafted = [length] * len(accepted)
        row_emitted = [len(r) for r in emitted]
        row_kept = [a if a < n else n for a, n in zip(accepted, row_emitted)]
        t0, t1, t2, t3 = times
        again = again_s or 0.0
        return StepRecord(
            gamma=gamma,
            length=length,
            rows=rows,
            depths=depths,
            accepted=accepted,
            row_drafted=row_drafted,
            row_kept=row_kept,
            row_emitted=row_emitted,
            drafted=sum(row_drafted),
            emitted_accepted=sum(row_kept),
            rejections=sum([a < depth for a, depth in zip(accepted, depths)]),
            new_tokens=sum(row_emitted),
            draft_s=t1 - t0,
            target_s=(t2 - t1) + again,
            verify_s=(t3 - t2) - again,
            prefill=prefill,
            timed=timed,
            target_calls=1 + (again_s is not None),
        )

    def _fold(self) -> None:
        """Add the kept steps up into the stats and forget them."""
        for step in range(len(self._steps)):
            self._add(self.record(step), self._steps[step][-1])
        self._steps.clear()

    def _add(self, record: StepRecord, prefill_calls: int) -> None:
        stats = self.stats
        stats.new_tokens += record.new_tokens
        stats.drafted_tokens += record.drafted
        stats.accepted_tokens += record.emitted_accepted
        stats.rejections += record.rejections
        stats.target_calls += record.target_calls
        stats.gammas.append(record.length)
        stats.chosen_gammas.append(record.gamma)
        stats.time_verify += record.verify_s
        if record.prefill:  # this step also decoded the prompt (the target's and a draft's): the prefill's time
            stats.prefill_steps += 1
            stats.prefill_draft_calls += prefill_calls - self.calls_before
            stats.time_prefill += record.draft_s + record.target_s
        else:
            stats.time_draft += record.draft_s
            stats.time_target += record.target_s

    def finish(self) -> GenerationStats:
        """The generation's GenerationStats: every kept step added up, then the drafter's calls and timers and the
        total time."""
        self._fold()
        self.stats.draft_calls = self.drafter.forward_calls - self.calls_before
        add_drafter_times(self.stats, self.drafter, self.timers_before)
        self.stats.time_total = perf_counter() - self.started - self.callback_seconds
        return self.stats

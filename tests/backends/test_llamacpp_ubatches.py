"""The micro-batch model of llama.cpp's split over KV streams, the filler it picks, and the fitted cost."""

from __future__ import annotations

from hypothesis import given, strategies as st

from draftverify.backends.llamacpp_ubatches import PRIOR_UBATCH_TOKENS, MicroBatchCost, filled_counts, micro_batches


def test_micro_batches_take_equal_counts_over_runs_of_consecutive_sequence_ids():
    assert micro_batches([4, 4, 4, 4]) == 1
    assert micro_batches([1, 3, 5, 8]) == 4  # 1 from all, 2 from the last three, 2 from the last two, 3 from one
    assert micro_batches([8, 1, 5, 3]) == 4  # 1 from all; 7 from the first alone (the run stops at 1); 2, 2
    assert micro_batches([4, 0, 4, 4]) == 2  # a gap in the ids splits equal rows
    assert micro_batches([0, 0]) == 0


def test_filler_joins_a_longer_rows_level_only_where_it_saves_more_than_it_costs():
    tokens = PRIOR_UBATCH_TOKENS
    assert filled_counts([1, 1, 1, 8], [8, 8, 8, 8], tokens) == [1, 1, 1, 8]  # 2 micro-batches beat 32 tokens
    assert filled_counts([1, 2, 2, 2], [2, 2, 2, 2], tokens) == [2, 2, 2, 2]  # 1 micro-batch for 1 more token
    assert filled_counts([1, 2, 2, 2], [1, 2, 2, 2], tokens) == [1, 2, 2, 2]  # no room: left-padded rows stay
    assert filled_counts([3, 3, 3], [9, 9, 9], tokens) == [3, 3, 3]  # one level already


@given(st.lists(st.tuples(st.integers(0, 12), st.integers(0, 6)), min_size=1, max_size=12), st.floats(0.5, 40))
def test_filler_never_costs_more_than_none_and_stays_within_each_rows_room(rows, ubatch_tokens):
    counts = [c for c, _ in rows]
    room = [c + extra if c else 0 for c, extra in rows]
    filled = filled_counts(counts, room, ubatch_tokens)
    assert all(c <= f <= r or f == c for c, f, r in zip(counts, filled, room))
    assert all(f == 0 for c, f in zip(counts, filled) if c == 0)

    def cost(x):
        return micro_batches(x) * ubatch_tokens + sum(x)

    assert cost(filled) <= cost(counts)


def test_the_fitted_cost_of_a_micro_batch_moves_from_the_prior_to_the_timings():
    fit = MicroBatchCost()
    assert abs(fit.ubatch_tokens - PRIOR_UBATCH_TOKENS) < 1e-6
    for _ in range(200):  # a machine where a micro-batch costs 3 tokens' time, in seconds
        for ubatches, tokens in ((1, 4), (2, 9), (1, 32), (4, 17)):
            fit.observe(ubatches, tokens, 0.001 * (3 * ubatches + tokens))
    assert abs(fit.ubatch_tokens - 3.0) < 0.2

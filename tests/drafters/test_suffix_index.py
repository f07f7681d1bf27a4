"""The suffix index against a brute-force scan of its sequences, its bound on memory, and its drafts."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from draftverify.errors import DraftVerifyError
from draftverify.suffix_index import SuffixIndex


def brute_continuations(sequences: list[list[int]], context: list[int], lo: int, hi: int) -> Counter:
    """What followed the longest suffix of context (lo..hi tokens) that occurs with a token after it, by scanning."""
    for k in range(min(hi, len(context)), lo - 1, -1):
        pattern = context[len(context) - k :]
        found = Counter(seq[i + k] for seq in sequences for i in range(len(seq) - k) if seq[i : i + k] == pattern)
        if found:
            return found
    return Counter()


def counts(index: SuffixIndex, context: list[int]) -> Counter:
    node = index.match(context)
    return Counter() if node is None else Counter(node.counts)


tokens = st.lists(st.integers(0, 4), min_size=0, max_size=30)  # a small alphabet: many repeats


@settings(max_examples=200, deadline=None)
@given(
    sequences=st.lists(tokens, min_size=1, max_size=5),
    context=st.lists(st.integers(0, 4), min_size=1, max_size=8),
    bounds=st.tuples(st.integers(1, 3), st.integers(0, 3)),
)
def test_longest_match_and_counts_equal_a_brute_force_scan(sequences, context, bounds):
    lo, hi = bounds[0], bounds[0] + bounds[1]
    index = SuffixIndex(lo, hi, max_tokens=10_000)
    for seq in sequences:
        half = len(seq) // 2
        sid = index.add(seq[:half])
        index.extend(sid, seq[half:])  # written in two pieces, as a row's tokens are committed
    assert counts(index, context) == brute_continuations(sequences, context, lo, hi)
    total = sum(len(s) for s in sequences)
    assert index.tokens == total
    node = index.match(context)
    assert node is None or node.total == sum(node.counts.values())


@settings(max_examples=100, deadline=None)
@given(
    sequences=st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=20), min_size=1, max_size=8),
    bound=st.integers(1, 60),
)
def test_the_oldest_finished_sequences_leave_and_leave_no_trace(sequences, bound):
    index = SuffixIndex(1, 3, max_tokens=bound)
    for seq in sequences:
        index.finish(index.add(seq))
    kept = [index.sequences[s] for s in index.sequences]
    assert index.tokens == sum(len(s) for s in kept) <= bound
    # the survivors are the newest ones, whole
    assert kept == sequences[len(sequences) - len(kept) :]
    # the counts are those of an index built from the survivors alone
    fresh = SuffixIndex(1, 3, max_tokens=10_000)
    for seq in kept:
        fresh.add(seq)
    assert {c: Counter(n.counts) for c, n in index.nodes.items()} == {
        c: Counter(n.counts) for c, n in fresh.nodes.items()
    }


def test_a_live_sequence_never_leaves():
    index = SuffixIndex(1, 2, max_tokens=4)
    old = index.add([1, 2, 3])
    index.finish(old)
    live = index.add([4, 5, 6, 7, 8])  # over the bound: the finished one leaves, the live one stays
    assert list(index.sequences) == [live] and index.tokens == 5
    index.extend(live, [9])
    assert list(index.sequences) == [live]
    index.finish(live)  # finished and over the bound: it leaves too
    assert index.tokens == 0 and index.nodes == {}


def test_continuation_follows_the_most_frequent_and_stops_when_unsure():
    index = SuffixIndex(1, 4, max_tokens=1000)
    for seq in ([1, 2, 3, 4, 5], [1, 2, 3, 4, 5], [1, 2, 3, 9, 9]):
        index.finish(index.add(seq))
    # after [1, 2]: 3 always (3/3), then 4 (2/3), then 5 (1/1 after [2, 3, 4])
    assert index.continuation([7, 1, 2], 5, min_prob=0.0) == [3, 4, 5]
    assert index.continuation([7, 1, 2], 2, min_prob=0.0) == [3, 4]
    # the chance of the whole draft is 2/3 after 4: a threshold above it stops before 4
    assert index.continuation([7, 1, 2], 5, min_prob=0.7) == [3]
    assert index.continuation([6], 5, min_prob=0.0) == []


def test_ties_go_to_the_latest_written_continuation():
    index = SuffixIndex(1, 2, max_tokens=1000)
    index.finish(index.add([1, 2]))
    index.finish(index.add([1, 3]))
    assert index.continuation([1], 1, 0.0) == [3]
    index.finish(index.add([1, 2]))
    assert index.continuation([1], 1, 0.0) == [2]


@pytest.mark.parametrize("lo, hi, bound", [(0, 3, 10), (3, 2, 10), (1, 2, 0)])
def test_bad_bounds_are_refused(lo, hi, bound):
    with pytest.raises(DraftVerifyError, match="suffix index"):
        SuffixIndex(lo, hi, bound)

"""NgramTable (counts, backoff, safetensors round trip) and NgramDrafter (greedy chain, q, sampling, bind)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from conftest import VOCAB, build_model
from draftverify.backends.hf.cached_lm import CachedLM
from draftverify.drafters import NgramDrafter, NgramTable
from draftverify.errors import DraftVerifyError
from draftverify.sampling import filter_logits
from draftverify.types import DecodingState, SamplingParams

torch.set_num_threads(1)


def as_dict(hit: tuple[torch.Tensor, torch.Tensor]) -> dict[int, float]:
    ids, counts = hit
    return dict(zip(ids.tolist(), counts.tolist()))


def state(tokens: list[int], params: SamplingParams | None = None, generator=None) -> DecodingState:
    return DecodingState(torch.tensor([tokens]), None, len(tokens), params or SamplingParams(), generator)


# ---------------------------------------------------------------- NgramTable


def test_counts_unigram_bigram_trigram_contexts():
    table = NgramTable.from_sequences([[1, 2, 3, 1, 2, 4]], order=3, vocab_size=10)
    got = {ctx: as_dict(hit) for ctx, hit in table.tables.items()}
    assert got == {
        (): {1: 2, 2: 2, 3: 1, 4: 1},
        (1,): {2: 2},
        (2,): {3: 1, 4: 1},
        (3,): {1: 1},
        (1, 2): {3: 1, 4: 1},
        (2, 3): {1: 1},
        (3, 1): {2: 1},
    }
    assert table.order == 3 and table.vocab_size == 10


def test_contexts_do_not_cross_sequence_boundaries():
    table = NgramTable.from_sequences([[1, 2], [3, 4]], order=3, vocab_size=10)
    assert as_dict(table.tables[()]) == {1: 1, 2: 1, 3: 1, 4: 1}
    assert (2,) not in table.tables  # 2 ends the first sequence; 3 starts the second
    assert set(table.tables) == {(), (1,), (3,)}


def test_bigram_order_has_only_one_token_contexts():
    table = NgramTable.from_sequences([[5, 6, 7, 5, 6]], order=2, vocab_size=10)
    assert max(len(ctx) for ctx in table.tables) == 1
    assert as_dict(table.tables[(5,)]) == {6: 2}


@pytest.fixture
def table() -> NgramTable:
    return NgramTable.from_sequences([[1, 2, 3, 1, 2, 4], [7, 2, 5]], order=3, vocab_size=10)


def test_backoff_uses_longest_seen_suffix(table):
    assert as_dict(table.next_counts([1, 2])) == {3: 1, 4: 1}  # trigram context seen
    assert as_dict(table.next_counts([7, 2])) == {5: 1}  # a different trigram context
    assert as_dict(table.next_counts([9, 9, 9, 1, 2])) == {3: 1, 4: 1}  # only the last order-1 tokens count
    assert as_dict(table.next_counts([5, 2])) == {3: 1, 4: 1, 5: 1}  # (5, 2) unseen -> bigram (2,)
    assert as_dict(table.next_counts([2])) == {3: 1, 4: 1, 5: 1}


def test_backoff_down_to_unigram(table):
    unigram = {1: 2, 2: 3, 3: 1, 4: 1, 7: 1, 5: 1}
    assert as_dict(table.next_counts([9, 8])) == unigram  # neither (9, 8) nor (8,) seen
    assert as_dict(table.next_counts([2, 4])) == unigram  # 4 ends a sequence: (4,) never has a successor
    assert as_dict(table.next_counts([])) == unigram


@pytest.mark.parametrize("order", [1, 0, -2])
def test_order_below_two_raises(order):
    with pytest.raises(DraftVerifyError, match="order"):
        NgramTable.from_sequences([[1, 2, 3]], order=order, vocab_size=10)


@pytest.mark.parametrize("bad", [-1, 10, 99])
def test_out_of_vocab_ids_raise(bad):
    with pytest.raises(DraftVerifyError, match="vocabulary"):
        NgramTable.from_sequences([[1, 2], [3, bad]], order=2, vocab_size=10)


def test_empty_data_raises():
    with pytest.raises(DraftVerifyError, match="empty"):
        NgramTable.from_sequences([[], []], order=2, vocab_size=10)


def test_save_load_round_trip(tmp_path, table):
    path = tmp_path / "table.safetensors"
    table.save(path)
    loaded = NgramTable.load(path)
    assert (loaded.order, loaded.vocab_size) == (table.order, table.vocab_size)
    assert set(loaded.tables) == set(table.tables)
    for ctx in table.tables:
        assert as_dict(loaded.tables[ctx]) == as_dict(table.tables[ctx])
    # identical next-token distributions, through the drafter's q as well
    for context in ([1, 2], [5, 2], [9, 8], [], [3], [7]):
        assert as_dict(loaded.next_counts(context)) == as_dict(table.next_counts(context))
    a = NgramDrafter(table).propose(state([1, 2]), 4)
    b = NgramDrafter(loaded).propose(state([1, 2]), 4)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.q_probs, b.q_probs)


def test_save_load_accepts_str_path(tmp_path, table):
    path = str(tmp_path / "t.safetensors")
    table.save(path)
    assert set(NgramTable.load(path).tables) == set(table.tables)


def test_load_missing_file_raises(tmp_path):
    missing = tmp_path / "nope.safetensors"
    with pytest.raises(DraftVerifyError, match="not found") as err:
        NgramTable.load(missing)
    assert "nope.safetensors" in str(err.value)


# ---------------------------------------------------------------- NgramDrafter

V = 12
# unambiguous majorities: after 1 comes 2 (2x vs 1x 6); after (1, 2) comes 3; then 4, 5; 5 is followed by 1
CHAIN_DATA = [[1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 6], [0, 1, 2, 3, 4, 5, 1, 2, 3]]


def reference_argmax_chain(table: NgramTable, context: list[int], n: int) -> list[int]:
    out = []
    for _ in range(n):
        ids, counts = table.next_counts(context)
        assert (counts == counts.max()).sum() == 1, "test data must have no ties"
        out.append(int(ids[counts.argmax()]))
        context = context + out[-1:]
    return out


def test_greedy_follows_argmax_chain():
    table = NgramTable.from_sequences(CHAIN_DATA, order=3, vocab_size=V)
    drafter = NgramDrafter(table)
    for start in ([0, 1], [9, 5], [4], [11, 11]):
        draft = drafter.propose(state(start), gamma=6)
        assert draft.tokens.shape == (1, 6)
        assert draft.tokens[0].tolist() == reference_argmax_chain(table, start, 6)
    assert drafter.propose(state([0, 1]), gamma=4).tokens.tolist() == [[2, 3, 4, 5]]
    assert drafter.forward_calls == 0


def test_q_rows_are_the_table_distributions():
    table = NgramTable.from_sequences(CHAIN_DATA, order=3, vocab_size=V)
    draft = NgramDrafter(table).propose(state([7, 1]), gamma=5)
    q = draft.q_probs
    assert q.shape == (1, 5, V)
    assert torch.allclose(q.sum(-1), torch.ones(1, 5), atol=1e-6)
    assert (q >= 0).all()
    context = [7, 1]
    for i, x in enumerate(draft.tokens[0].tolist()):
        ids, counts = table.next_counts(context)
        expected = torch.zeros(V)
        expected[ids] = counts / counts.sum()
        assert torch.allclose(q[0, i], expected, atol=1e-6)
        context.append(x)


def empirical_first_token(drafter, params, draws, seed):
    gen = torch.Generator().manual_seed(seed)
    st = state([3, 1], params, gen)
    counts = Counter()
    q = None
    for _ in range(draws):
        draft = drafter.propose(st, gamma=1)
        counts[int(draft.tokens[0, 0])] += 1
        q = draft.q_probs[0, 0] if q is None else q
    freq = torch.tensor([counts[v] / draws for v in range(V)])
    return freq, q


@pytest.mark.parametrize(
    "params",
    [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7), SamplingParams(temperature=1.3, top_k=3)],
    ids=["t1", "t0.7", "t1.3-top3"],
)
def test_sampled_drafts_match_q(params):
    # after (3, 1): 2 x4, 6 x2, 8 x1, 9 x1 -- a spread distribution
    data = [[3, 1, 2], [3, 1, 2], [3, 1, 2], [3, 1, 2], [3, 1, 6], [3, 1, 6], [3, 1, 8], [3, 1, 9]]
    table = NgramTable.from_sequences(data, order=3, vocab_size=V)
    drafter = NgramDrafter(table)
    draws = 3000
    freq, q = empirical_first_token(drafter, params, draws, seed=0)
    # q is the filtered softmax of the log-counts (the target's transform)
    counts = torch.zeros(V)
    counts[[2, 6, 8, 9]] = torch.tensor([4.0, 2.0, 1.0, 1.0])
    expected_q = filter_logits(counts.log(), params).softmax(-1)
    assert torch.allclose(q, expected_q, atol=1e-6)
    assert freq[q == 0].sum() == 0  # never drafts a filtered-out token
    # 5 sigma of a binomial proportion at 3000 draws is < 0.046
    sigma = (q * (1 - q) / draws).sqrt()
    assert ((freq - q).abs() <= 5 * sigma + 1e-9).all(), (freq, q)


@pytest.mark.parametrize("coupling", [False, True])
def test_sampling_is_reproducible_with_seed(coupling):
    table = NgramTable.from_sequences(CHAIN_DATA, order=2, vocab_size=V)
    params = SamplingParams(temperature=1.0, coupling=coupling)

    def drafts(seed: int) -> list[int]:
        gen = torch.Generator().manual_seed(seed)
        return NgramDrafter(table).propose(state([1], params, gen), gamma=8).tokens[0].tolist()

    assert drafts(123) == drafts(123)
    assert len({tuple(drafts(seed)) for seed in range(123, 133)}) > 1  # the seed decides: sampling, not argmax


def test_bind_rejects_vocabulary_mismatch():
    target = CachedLM(build_model("llama", layers=1))
    good = NgramDrafter(NgramTable.from_sequences([[1, 2, 3]], order=2, vocab_size=VOCAB))
    good.bind(target, 32)  # no error
    bad = NgramDrafter(NgramTable.from_sequences([[1, 2, 3]], order=2, vocab_size=VOCAB + 4))
    with pytest.raises(DraftVerifyError, match="vocabulary"):
        bad.bind(target, 32)


def test_each_row_of_a_batch_drafts_from_its_own_context():
    drafter = NgramDrafter(NgramTable.from_sequences([[1, 2, 3, 4]], order=2, vocab_size=V))
    st = DecodingState(torch.tensor([[0, 1], [2, 3]]), None, 2, SamplingParams(), None, lengths=torch.tensor([1, 2]))
    draft = drafter.propose(st, 2)
    assert draft.tokens.tolist() == [[2, 3], [4, 1]]  # row 0 never sees its padding token 0

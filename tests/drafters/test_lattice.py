"""The top-k sausage lattice, its oracle length and the k-best n-gram Viterbi (checked against brute force)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from draftverify import DraftVerifyError
from draftverify.drafters.lattice import SausageLattice, kbest_paths
from draftverify.drafters.ngram import NgramTable

V = 12


def table() -> NgramTable:
    gen = np.random.default_rng(0)
    return NgramTable.from_sequences([gen.integers(0, V, 40).tolist() for _ in range(6)], order=3, vocab_size=V)


def lattice(seed: int = 0, depth: int = 4, k: int = 3) -> SausageLattice:
    gen = torch.Generator().manual_seed(seed)
    return SausageLattice.top_k(torch.randn(depth, V, generator=gen) * 2, k)


def brute_force(
    lat: SausageLattice, tab: NgramTable, context: list[int], alpha: float
) -> list[tuple[float, list[int]]]:
    scored = []
    for choice in itertools.product(range(lat.tokens.shape[1]), repeat=lat.depth):
        path = [int(lat.tokens[j, c]) for j, c in enumerate(choice)]
        score = sum(float(lat.logprobs[j, c]) for j, c in enumerate(choice))
        history = list(context)
        for token in path:
            score += alpha * float(tab.backoff_logprobs(history[-(tab.order - 1) :])[token])
            history.append(token)
        scored.append((score, path))
    return sorted(scored, key=lambda x: -x[0])


def test_top_k_lattice_holds_each_heads_best_tokens_best_first():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0], [5.0, 0.0, 0.0, 4.0]])
    lat = SausageLattice.top_k(logits, 2)
    assert lat.tokens.tolist() == [[1, 3], [0, 3]]
    assert torch.allclose(lat.logprobs, logits.log_softmax(-1).gather(1, lat.tokens))
    assert lat.oracle_length([3, 3, 9]) == 2 and lat.oracle_length([3, 1]) == 1 and lat.oracle_length([0]) == 0


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("alpha", [0.0, 0.5, 2.0])
def test_kbest_viterbi_matches_brute_force(seed, alpha):
    lat, tab = lattice(seed), table()
    context = [int(x) for x in torch.randint(0, V, (5,), generator=torch.Generator().manual_seed(seed))]
    expected = brute_force(lat, tab, context, alpha)
    found = kbest_paths(lat, tab, context, alpha, p=5)
    assert len(found) == 5
    scores = {tuple(path): score for score, path in expected}
    assert [scores[tuple(path)] for path in found] == pytest.approx([score for score, _ in expected[:5]])


def test_one_best_without_the_ngram_is_each_heads_argmax():
    lat = lattice(3)
    assert kbest_paths(lat, None, [1, 2], alpha=0.0, p=1) == [lat.tokens[:, 0].tolist()]


def test_rescoring_repairs_a_repetition_the_ngram_never_saw():
    """Heads that both prefer token 5 draft "5 5"; a bigram that never saw 5 followed by 5 moves the second to 6."""
    tab = NgramTable.from_sequences([[5, 6, 7, 5, 6, 7, 5, 6]], order=2, vocab_size=V)
    logits = torch.full((2, V), -5.0)
    logits[:, 5] = 2.0
    logits[1, 6] = 1.5
    lat = SausageLattice.top_k(logits, 2)
    assert kbest_paths(lat, None, [7], 0.0, 1) == [[5, 5]]
    assert kbest_paths(lat, tab, [7], 1.0, 1) == [[5, 6]]


def test_backoff_scores_are_finite_for_every_token():
    scores = table().backoff_logprobs([1, 2])
    assert scores.shape == (V,) and np.isfinite(scores).all()


def _by_count(tab: NgramTable) -> NgramTable:
    """The same counts with each context's next tokens by count, most frequent first, as `train ngram` writes them."""
    arrays = {}
    for k, level in tab.levels.items():
        order = np.concatenate(
            [
                lo + np.argsort(-level.counts[lo:hi], kind="stable")
                for lo, hi in zip(level.offsets[:-1], level.offsets[1:])
            ]
        )
        arrays[k] = (level.contexts, level.offsets, level.tokens[order], level.counts[order])
    return NgramTable.from_arrays(tab.order, tab.vocab_size, arrays)


def reference_backoff(sequences: list[list[int]], context: list[int], backoff: float = 0.4) -> np.ndarray:
    """Stupid backoff straight from its definition, over plain Counters."""
    from collections import Counter

    seen = Counter(token for seq in sequences for token in seq)
    scores = np.array([1.0 + seen[w] for w in range(V)]) / (V + sum(seen.values()))
    for k in range(1, min(2, len(context)) + 1):
        ctx = tuple(context[-k:])
        nxt = Counter(seq[i] for seq in sequences for i in range(k, len(seq)) if tuple(seq[i - k : i]) == ctx)
        if nxt:
            total = sum(nxt.values())
            scores = np.array([nxt[w] / total if nxt[w] else backoff * scores[w] for w in range(V)])
    return np.log(scores)


@pytest.mark.parametrize("context", [[1, 2], [3], [], [11, 11], [0, 5]])
def test_backoff_scores_for_a_few_tokens_are_the_full_arrays_whatever_the_run_order(context):
    gen = np.random.default_rng(0)
    sequences = [gen.integers(0, V, 40).tolist() for _ in range(6)]
    tab = NgramTable.from_sequences(sequences, order=3, vocab_size=V)
    full = tab.backoff_logprobs(context)
    np.testing.assert_allclose(full, reference_backoff(sequences, context), rtol=1e-12)
    candidates = [7, 0, 11, 3]
    for each in (tab, _by_count(tab)):
        assert each.backoff_logprobs(context).tolist() == full.tolist()
        assert each.backoff_logprobs(context, candidates).tolist() == full[candidates].tolist()


def test_bad_arguments_are_refused():
    with pytest.raises(DraftVerifyError, match="k >= 1"):
        SausageLattice.top_k(torch.zeros(2, V), 0)
    with pytest.raises(DraftVerifyError, match="p >= 1"):
        kbest_paths(lattice(), table(), [1], 0.5, 0)

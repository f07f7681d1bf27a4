"""Tests for draftverify.sampling: filter_logits, probs_from_logits, residual, sample, choose.

The expected kept sets are computed here by an independent reference (plain Python sort over float64), so a
wrong order of the filters, an off-by-one in top-p, or a top-k that keeps k+1 tokens is caught.
"""

from __future__ import annotations

import math

import pytest
import torch

from draftverify.errors import DraftVerifyError
from draftverify.sampling import (
    choose,
    draw,
    filter_logits,
    gumbel_argmax,
    gumbel_noise,
    position_seed,
    probs_from_logits,
    residual,
    sample,
)
from draftverify.types import SamplingParams

torch.set_num_threads(1)


def _distinct_logits(gen: torch.Generator, *shape: int) -> torch.Tensor:
    """Random float64 logits with no ties in the last dim (a random permutation of spread values plus jitter)."""
    v = shape[-1]
    base = torch.linspace(-3.0, 3.0, v, dtype=torch.float64)
    rows = []
    for _ in range(math.prod(shape[:-1])):
        perm = torch.randperm(v, generator=gen)
        rows.append(base[perm] + 0.1 * torch.rand(v, generator=gen, dtype=torch.float64) / v)
    return torch.stack(rows).reshape(shape)


def _reference_kept(logits_row: torch.Tensor, temperature: float, top_k: int, top_p: float) -> set[int]:
    """Indices that survive temperature -> top-k -> top-p, computed with Python lists."""
    z = [float(x) / (temperature if temperature > 0 else 1.0) for x in logits_row]
    order = sorted(range(len(z)), key=lambda i: -z[i])
    if top_k:
        order = order[:top_k]
    m = max(z[i] for i in order)
    weights = [math.exp(z[i] - m) for i in order]
    total = sum(weights)
    kept, mass = [], 0.0
    for i, w in zip(order, weights):
        kept.append(i)
        mass += w / total
        if mass >= top_p:
            break
    return set(kept)


def _reference_probs(logits_row: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    kept = _reference_kept(logits_row, params.temperature, params.top_k, params.top_p)
    z = logits_row.double() / (params.temperature if params.temperature > 0 else 1.0)
    mask = torch.zeros_like(z, dtype=torch.bool)
    mask[list(kept)] = True
    return torch.where(mask, z, torch.tensor(float("-inf"), dtype=z.dtype)).softmax(-1)


def _finite_set(row: torch.Tensor) -> set[int]:
    return set(torch.isfinite(row).nonzero().flatten().tolist())


# ----------------------------------------------------------------------------------------------------------
# filter_logits
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [0.3, 0.7, 1.3, 2.5])
def test_temperature_divides_logits(temperature):
    logits = _distinct_logits(torch.Generator().manual_seed(0), 3, 9)
    out = filter_logits(logits, SamplingParams(temperature=temperature))
    torch.testing.assert_close(out, logits / temperature, rtol=0, atol=1e-12)


@pytest.mark.parametrize("temperature", [5e-324, 1e-300, 1e-30])  # 0 in float32; logits / T past float32's range
def test_a_vanishing_temperature_keeps_the_top_token(temperature):
    logits = _distinct_logits(torch.Generator().manual_seed(0), 3, 9).float() * 10
    probs = probs_from_logits(logits, SamplingParams(temperature=temperature))
    assert torch.equal(probs, torch.nn.functional.one_hot(logits.argmax(dim=-1), 9).float())


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_temperature_zero_and_one_leave_logits_unchanged(temperature):
    logits = _distinct_logits(torch.Generator().manual_seed(1), 2, 7)
    out = filter_logits(logits, SamplingParams(temperature=temperature))
    assert torch.equal(out, logits)


def test_filter_does_not_modify_its_input():
    logits = _distinct_logits(torch.Generator().manual_seed(2), 4, 10)
    before = logits.clone()
    filter_logits(logits, SamplingParams(temperature=0.8, top_k=3, top_p=0.7))
    assert torch.equal(logits, before)


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_top_k_keeps_exactly_k_highest(temperature):
    gen = torch.Generator().manual_seed(3)
    v = 10
    logits = _distinct_logits(gen, 5, v)
    for k in range(1, v):
        out = filter_logits(logits, SamplingParams(temperature=temperature, top_k=k))
        for row_in, row_out in zip(logits, out):
            kept = _finite_set(row_out)
            assert len(kept) == k
            assert kept == set(torch.topk(row_in, k).indices.tolist())
            # kept entries are the tempered logits, untouched otherwise
            idx = torch.tensor(sorted(kept))
            torch.testing.assert_close(row_out[idx], row_in[idx] / temperature, rtol=0, atol=1e-12)
            assert torch.all(row_out[~torch.isfinite(row_out)] == float("-inf"))


@pytest.mark.parametrize("k", [0, 10, 11, 50])
def test_top_k_disabled_or_at_least_vocab_keeps_everything(k):
    logits = _distinct_logits(torch.Generator().manual_seed(4), 3, 10)
    out = filter_logits(logits, SamplingParams(temperature=1.0, top_k=k))
    assert torch.equal(out, logits)


def test_top_k_larger_than_finite_count_keeps_finite_entries_and_no_nan():
    logits = torch.tensor([[1.0, float("-inf"), 0.5, float("-inf"), -2.0]], dtype=torch.float64)
    out = filter_logits(logits, SamplingParams(temperature=1.0, top_k=4))
    assert _finite_set(out[0]) == {0, 2, 4}
    assert not torch.isnan(out).any()
    probs = probs_from_logits(logits, SamplingParams(temperature=1.0, top_k=4))
    assert not torch.isnan(probs).any()
    assert probs[0, 1] == 0 and probs[0, 3] == 0


def test_top_p_hand_example():
    # probs 0.5, 0.3, 0.15, 0.05 (as logs so the softmax recovers them)
    probs = torch.tensor([0.15, 0.5, 0.05, 0.3], dtype=torch.float64)
    logits = probs.log()[None]
    cases = {
        0.10: {1},  # top-1 alone already reaches it
        0.45: {1},
        0.55: {1, 3},  # 0.5 < 0.55 <= 0.8
        0.79: {1, 3},
        0.81: {1, 3, 0},  # 0.8 < 0.81 <= 0.95
        0.96: {1, 3, 0, 2},
    }
    for top_p, expected in cases.items():
        out = filter_logits(logits, SamplingParams(temperature=1.0, top_p=top_p))
        assert _finite_set(out[0]) == expected, top_p


def test_top_p_keeps_smallest_set_reaching_mass_random():
    gen = torch.Generator().manual_seed(5)
    checked = 0
    for trial in range(300):
        v = int(torch.randint(2, 12, (1,), generator=gen))
        logits = torch.randn(v, generator=gen, dtype=torch.float64) * 2
        top_p = float(torch.rand((), generator=gen, dtype=torch.float64)) * 0.98 + 0.01
        probs = logits.softmax(-1)
        cum = probs.sort(descending=True).values.cumsum(-1)
        if (cum - top_p).abs().min() < 1e-6:  # too close to a boundary for float32/float64 differences
            continue
        out = filter_logits(logits[None], SamplingParams(temperature=1.0, top_p=top_p))[0]
        kept = _finite_set(out)
        assert kept == _reference_kept(logits, 1.0, 0, top_p)
        kept_mass = float(probs[sorted(kept)].sum())
        assert kept_mass >= top_p  # reaches top_p ...
        smallest = min(float(probs[i]) for i in kept)
        assert kept_mass - smallest < top_p  # ... and is the smallest such set
        assert int(probs.argmax()) in kept
        checked += 1
    assert checked > 250


@pytest.mark.parametrize("top_p", [5e-324, 1e-300, 1e-6, 0.01, 0.1])  # the first two are 0 in float32
def test_top_p_always_keeps_top1(top_p):
    logits = _distinct_logits(torch.Generator().manual_seed(6), 6, 8).float() * 0.1  # flat: top-1 mass ~ 1/8
    out = filter_logits(logits, SamplingParams(temperature=1.0, top_p=top_p))  # float32, as a model's logits
    for row_in, row_out in zip(logits, out):
        assert _finite_set(row_out) == {int(row_in.argmax())}


def test_top_p_is_applied_to_the_tempered_distribution():
    probs = torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64)
    logits = probs.log()[None]
    assert _finite_set(filter_logits(logits, SamplingParams(temperature=1.0, top_p=0.55))[0]) == {0}
    # at temperature 3 the top-1 mass drops below 0.55, so a second token is needed
    flat = (probs.log() / 3).softmax(-1)
    assert flat[0] < 0.55
    assert _finite_set(filter_logits(logits, SamplingParams(temperature=3.0, top_p=0.55))[0]) == {0, 1}


def test_top_p_is_applied_after_top_k_renormalisation():
    probs = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
    logits = probs.log()[None]
    # top-p 0.5 alone keeps two tokens (0.4 < 0.5 <= 0.7)
    assert _finite_set(filter_logits(logits, SamplingParams(temperature=1.0, top_p=0.5))[0]) == {0, 1}
    # after top-2 the kept tokens renormalise to 4/7, 3/7 and 4/7 >= 0.5 keeps one
    assert _finite_set(filter_logits(logits, SamplingParams(temperature=1.0, top_k=2, top_p=0.5))[0]) == {0}


def test_combined_filters_match_reference_on_batched_input():
    gen = torch.Generator().manual_seed(7)
    logits = _distinct_logits(gen, 2, 3, 12)  # [..., V] with two leading dims
    params = SamplingParams(temperature=0.8, top_k=7, top_p=0.75)
    out = filter_logits(logits, params)
    assert out.shape == logits.shape
    for i in range(2):
        for j in range(3):
            assert _finite_set(out[i, j]) == _reference_kept(logits[i, j], 0.8, 7, 0.75)


# ----------------------------------------------------------------------------------------------------------
# probs_from_logits
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=1.3),
        SamplingParams(temperature=1.0, top_k=3),
        SamplingParams(temperature=1.0, top_p=0.8),
        SamplingParams(temperature=0.9, top_k=6, top_p=0.9),
    ],
    ids=["t0.7", "t1", "t1.3", "topk3", "topp0.8", "combined"],
)
def test_probs_from_logits_matches_reference(params):
    gen = torch.Generator().manual_seed(8)
    logits = _distinct_logits(gen, 6, 10)
    probs = probs_from_logits(logits, params)
    assert probs.shape == logits.shape
    assert probs.is_floating_point()
    torch.testing.assert_close(probs.sum(-1).double(), torch.ones(6, dtype=torch.float64), rtol=0, atol=1e-5)
    for row_in, row_p in zip(logits, probs):
        torch.testing.assert_close(row_p.double(), _reference_probs(row_in, params), rtol=0, atol=1e-6)


def test_probs_from_logits_greedy_is_untempered_unfiltered_softmax():
    logits = _distinct_logits(torch.Generator().manual_seed(9), 3, 8)
    for params in (SamplingParams(), SamplingParams(temperature=0.0, top_k=2, top_p=0.3)):
        probs = probs_from_logits(logits, params)
        torch.testing.assert_close(probs.double(), logits.softmax(-1), rtol=0, atol=1e-6)
        assert (probs > 0).all()


def test_sampling_params_validation():
    for bad in (
        dict(temperature=-0.1),
        dict(top_k=-1),
        dict(top_k=1.5),
        dict(top_k=True),
        dict(top_p=0.0),
        dict(top_p=1.1),
        dict(temperature=float("nan")),
        dict(top_p=float("nan")),
    ):
        with pytest.raises(DraftVerifyError):
            SamplingParams(**bad)


# ----------------------------------------------------------------------------------------------------------
# residual
# ----------------------------------------------------------------------------------------------------------


def test_residual_hand_example():
    p = torch.tensor([0.5, 0.2, 0.2, 0.1])
    q = torch.tensor([0.1, 0.6, 0.2, 0.1])
    # max(0, p - q) = [0.4, 0, 0, 0] -> [1, 0, 0, 0]
    torch.testing.assert_close(residual(p, q), torch.tensor([1.0, 0.0, 0.0, 0.0]))
    q2 = torch.tensor([0.3, 0.3, 0.3, 0.1])
    # max(0, p - q2) = [0.2, 0, 0, 0]
    torch.testing.assert_close(residual(p, q2), torch.tensor([1.0, 0.0, 0.0, 0.0]))
    q3 = torch.tensor([0.25, 0.05, 0.6, 0.1])
    # max(0, p - q3) = [0.25, 0.15, 0, 0] -> [0.625, 0.375, 0, 0]
    torch.testing.assert_close(residual(p, q3), torch.tensor([0.625, 0.375, 0.0, 0.0]))


def test_residual_random_batched_and_pure():
    gen = torch.Generator().manual_seed(10)
    p = torch.rand(50, 9, generator=gen, dtype=torch.float64).softmax(-1) ** 3
    p = p / p.sum(-1, keepdim=True)
    q = torch.rand(50, 9, generator=gen, dtype=torch.float64)
    q = q / q.sum(-1, keepdim=True)
    p0, q0 = p.clone(), q.clone()
    r = residual(p, q)
    assert torch.equal(p, p0) and torch.equal(q, q0)  # inputs untouched
    expected = (p - q).clamp(min=0)
    expected = expected / expected.sum(-1, keepdim=True)
    torch.testing.assert_close(r, expected, rtol=0, atol=1e-12)
    assert (r[p <= q] == 0).all()


def test_residual_p_equals_q_falls_back_to_p():
    p = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.7, 0.1, 0.1, 0.1]])
    q = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.1, 0.1, 0.1, 0.7]])
    r = residual(p, q)
    assert torch.isfinite(r).all()
    torch.testing.assert_close(r[0], p[0])  # no mass: p itself (and never NaN)
    torch.testing.assert_close(r[1], torch.tensor([1.0, 0.0, 0.0, 0.0]))


def test_residual_is_normalised_even_for_tiny_positive_mass():
    p = torch.tensor([0.5, 0.5, 1e-35], dtype=torch.float64)
    q = torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)
    # max(0, p - q) = [0, 0, 1e-35] -> norm = [0, 0, 1]
    torch.testing.assert_close(residual(p, q), torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64))


def test_residual_against_zero_q_is_p_and_scaled_q_is_lenient_residual():
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    torch.testing.assert_close(residual(p, torch.zeros(3, dtype=torch.float64)), p)
    q = torch.tensor([0.2, 0.2, 0.6], dtype=torch.float64)
    lq = 0.5 * q  # [0.1, 0.1, 0.3] -> max(0, p - lq) = [0.4, 0.2, 0]
    torch.testing.assert_close(residual(p, lq), torch.tensor([2 / 3, 1 / 3, 0.0], dtype=torch.float64))


# ----------------------------------------------------------------------------------------------------------
# sample / choose
# ----------------------------------------------------------------------------------------------------------


def test_sample_seeded_is_reproducible():
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4]).expand(2, 500, 4)
    a = sample(probs, torch.Generator().manual_seed(123))
    b = sample(probs, torch.Generator().manual_seed(123))
    c = sample(probs, torch.Generator().manual_seed(124))
    assert a.shape == (2, 500) and a.dtype == torch.long
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_sample_respects_support_and_frequencies():
    probs = torch.tensor([0.0, 0.5, 0.0, 0.3, 0.2])
    n = 20000
    draws = sample(probs.expand(n, 5), torch.Generator().manual_seed(0))
    counts = torch.bincount(draws, minlength=5).double()
    assert counts[0] == 0 and counts[2] == 0
    freq = counts / n
    sigma = (probs.double() * (1 - probs.double()) / n).sqrt()
    assert ((freq - probs.double()).abs() <= 5 * sigma + 1e-12).all()


def test_sample_single_row_and_one_hot():
    probs = torch.tensor([0.0, 0.0, 1.0, 0.0])
    assert int(sample(probs, torch.Generator().manual_seed(0))) == 2
    assert sample(probs, None).shape == ()


def test_choose_greedy_is_argmax_and_sampled_is_seeded():
    logits = _distinct_logits(torch.Generator().manual_seed(11), 4, 3, 9)
    assert torch.equal(choose(logits, SamplingParams(), None), logits.argmax(-1))
    params = SamplingParams(temperature=1.0, top_k=3)
    a = choose(logits, params, torch.Generator().manual_seed(5))
    b = choose(logits, params, torch.Generator().manual_seed(5))
    assert a.shape == (4, 3)
    assert torch.equal(a, b)
    top3 = torch.topk(logits, 3).indices
    assert (top3 == a[..., None]).any(-1).all()


# ---- position-keyed (coupled) sampling ----------------------------------------------------------------------


def test_gumbel_noise_is_a_pure_function_of_seed_and_position():
    a = gumbel_noise(3, 10, 4, 50)
    assert a.shape == (4, 50) and a.dtype == torch.float32
    assert torch.equal(a, gumbel_noise(3, 10, 4, 50))
    assert torch.equal(a[2:], gumbel_noise(3, 12, 2, 50))  # position t's row does not depend on the window
    assert not torch.equal(a[0], a[1])
    assert not torch.equal(a, gumbel_noise(4, 10, 4, 50))
    assert len({position_seed(s, t) for s in range(50) for t in range(50)}) == 2500


def test_gumbel_noise_is_standard_gumbel():
    g = gumbel_noise(0, 0, 400, 500).double().flatten()  # 200k draws
    assert float(g.mean()) == pytest.approx(0.5772156649, abs=0.01)  # Euler-Mascheroni
    assert float(g.var()) == pytest.approx(math.pi**2 / 6, abs=0.03)


def test_draw_greedy_coupled_and_plain():
    probs = torch.tensor([[0.1, 0.6, 0.3]])
    assert draw(probs, SamplingParams(), None, 0).tolist() == [1]
    coupled = SamplingParams(temperature=1.0, seed=9)
    gen = torch.Generator().manual_seed(9)
    expected = gumbel_argmax(probs, gumbel_noise(9, 5, 1, 3)[0])
    assert torch.equal(draw(probs, coupled, gen, 5), expected)
    state = gen.get_state()
    draw(probs, coupled, gen, 5)
    assert torch.equal(gen.get_state(), state)  # coupled draws never consume the generator's stream
    plain = SamplingParams(temperature=1.0, seed=9, coupling=False)
    draw(probs, plain, gen, 5)
    assert not torch.equal(gen.get_state(), state)


def test_coupling_defaults_to_on_exactly_when_seeded():
    assert SamplingParams(temperature=1.0, seed=0).coupled
    assert not SamplingParams(temperature=1.0).coupled
    assert SamplingParams(temperature=1.0, coupling=True).coupled
    assert not SamplingParams(temperature=1.0, seed=0, coupling=False).coupled
    assert not SamplingParams(seed=0, coupling=True).coupled  # greedy has no noise to couple


def test_row_params_group_rows_by_settings_and_collapse_when_uniform():
    from draftverify.sampling import RowParams, row_params

    a, b = SamplingParams(), SamplingParams(temperature=0.7, top_k=5, seed=1)
    assert row_params([a, SamplingParams()]) == a  # one setting: a plain SamplingParams
    assert row_params([b, SamplingParams(temperature=0.7, top_k=5, seed=9)]) == b  # seeds do not split groups
    rows = row_params([a, b, a, b])
    assert isinstance(rows, RowParams) and not rows.greedy
    assert [(p, idx.tolist()) for p, idx in rows.groups()] == [(a, [0, 2]), (b, [1, 3])]
    logits = torch.randn(4, 3, 11)
    probs = probs_from_logits(logits, rows)
    for i, p in enumerate([a, b, a, b]):
        assert torch.equal(probs[i], probs_from_logits(logits[i : i + 1], p)[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_argmax_is_torchs_first_maximal_index(dtype):
    """sampling.argmax (NumPy on the CPU for float32 / float64, torch otherwise) picks what torch's argmax picks,
    ties included (the first maximal index), for one vector, rows, a [B, N, V] block and a strided view."""
    from draftverify.sampling import argmax

    g = torch.Generator().manual_seed(0)
    block = torch.randint(0, 4, (3, 5, 64), generator=g).to(dtype)  # few distinct values: many ties
    for values in (block[0, 0], block[0], block, block[:, 1:4], block.transpose(0, 1)):
        got = argmax(values)
        assert got.dtype == torch.long and got.shape == values.shape[:-1]
        assert torch.equal(got, values.argmax(dim=-1))

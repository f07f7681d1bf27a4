"""Closed-form theory of speculative decoding.

Formulas from Leviathan, Kalman & Matias, "Fast Inference from Transformers
via Speculative Decoding" (ICML 2023), Section 3 and Appendix A.5.  Variable
names follow the paper:

* ``alpha`` -- expected acceptance rate E(beta) (Corollary 6), in [0, 1];
* ``gamma`` -- number of tokens drafted by M_q per call of Algorithm 1;
* ``c``     -- walltime cost of one M_q run relative to one M_p run (Definition 7);
* ``c_hat`` -- arithmetic operations per token of M_q relative to M_p (Section 3.4);
* ``l``     -- lenience factor of Appendix A.5, in (0, 1].

All functions are pure.  Scalar formulas take real numbers (or one-element
tensors) and return ``float``.  The distribution functions take ``p`` (target
model M_p) and ``q`` (approximation model M_q) as tensors whose *last*
dimension is the vocabulary; leading dimensions broadcast.  Invalid inputs
raise ``ValueError`` naming the argument, its value and the allowed range;
nothing is clamped.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import NamedTuple, Union

import torch

__all__ = [
    "OptimalGamma",
    "d_lk",
    "acceptance_rate",
    "expected_alpha",
    "lenient_acceptance_rate",
    "gumbel_acceptance_rate",
    "expected_tokens_per_call",
    "walltime_factor",
    "operations_factor",
    "optimal_gamma",
    "min_improvement_factor",
]

Distribution = Union[torch.Tensor, Sequence[float], Sequence[Sequence[float]]]
DEFAULT_MAX_GAMMA = 64


class OptimalGamma(NamedTuple):
    """Result of :func:`optimal_gamma`: the chosen ``gamma`` and its Theorem 8 factor."""

    gamma: int
    factor: float


# --------------------------------------------------------------------------
# Input validation
# --------------------------------------------------------------------------


def _real(name: str, value: object, allowed: str) -> float:
    """Convert ``value`` to a finite float or raise ValueError naming ``name``."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.is_complex():
            raise ValueError(f"{name} must be a real scalar in {allowed}, got tensor of shape {tuple(value.shape)}")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number in {allowed}, got {value!r} ({type(value).__name__})")
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"{name} must be a finite number in {allowed}, got {value!r}")
    return out


def _alpha(alpha: object) -> float:
    a = _real("alpha", alpha, "[0, 1]")
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
    return a


def _nonneg(name: str, value: object) -> float:
    v = _real(name, value, "[0, inf)")
    if v < 0.0:
        raise ValueError(f"{name} must be in [0, inf), got {value!r}")
    return v


def _lenience(l: object) -> float:  # noqa: E741 -- paper's name
    v = _real("l", l, "(0, 1]")
    if not 0.0 < v <= 1.0:
        raise ValueError(f"l must be in (0, 1], got {l!r}")
    return v


def _integer(name: str, value: object, minimum: int) -> int:
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r} ({type(value).__name__})")
    v = int(value)
    if v < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return v


def _sum_tolerance(dtype: torch.dtype) -> float:
    """Tolerance on |sum(p) - 1|: sqrt(machine eps) of the input dtype, at least 1e-6."""
    return max(1e-6, math.sqrt(torch.finfo(dtype).eps))


def _distribution(name: str, value: Distribution) -> torch.Tensor:
    """Return ``value`` as a floating tensor after checking it is a distribution over its last dim."""
    t = value if isinstance(value, torch.Tensor) else torch.as_tensor(value, dtype=torch.float64)
    if t.is_complex():
        raise ValueError(f"{name} must be real-valued, got dtype {t.dtype}")
    if not t.is_floating_point():
        t = t.to(torch.float64)
    if t.dim() == 0 or t.shape[-1] == 0:
        raise ValueError(f"{name} must have a non-empty trailing vocabulary dimension, got shape {tuple(t.shape)}")
    if t.numel() == 0:  # empty batch of rows: nothing to check
        return t
    with torch.no_grad():
        d = t.detach()
        if not bool(torch.isfinite(d).all()):
            raise ValueError(f"{name} must contain only finite probabilities (entries in [0, 1]), found NaN/inf")
        lowest = float(d.min())
        if lowest < 0.0:
            raise ValueError(f"{name} entries must be probabilities in [0, 1], found {lowest!r}")
        sums = d.to(torch.float64).sum(dim=-1)
        worst = float((sums - 1.0).abs().max())
        tol = _sum_tolerance(t.dtype)
        if worst > tol:
            bad = float(sums.flatten()[(sums - 1.0).abs().flatten().argmax()])
            raise ValueError(
                f"{name} must sum to 1 over its last dimension (tolerance {tol:g}), found a row summing to {bad!r}"
            )
    return t


def _pair(p: Distribution, q: Distribution, p_name: str = "p", q_name: str = "q") -> tuple[torch.Tensor, torch.Tensor]:
    pt, qt = _distribution(p_name, p), _distribution(q_name, q)
    if pt.shape[-1] != qt.shape[-1]:
        raise ValueError(
            f"{p_name} and {q_name} must share the vocabulary (last) dimension, got {p_name} shape "
            f"{tuple(pt.shape)} and {q_name} shape {tuple(qt.shape)}"
        )
    try:
        torch.broadcast_shapes(pt.shape, qt.shape)
    except RuntimeError as exc:
        raise ValueError(
            f"{p_name} and {q_name} shapes must broadcast, got {p_name} shape {tuple(pt.shape)} "
            f"and {q_name} shape {tuple(qt.shape)}"
        ) from exc
    dtype = torch.promote_types(pt.dtype, qt.dtype)
    return pt.to(dtype), qt.to(dtype)


def _output(result: torch.Tensor, p: object, q: object) -> Union[torch.Tensor, float, list]:
    """Tensor in -> tensor out; otherwise a float (single row) or nested list."""
    if isinstance(p, torch.Tensor) or isinstance(q, torch.Tensor):
        return result
    return result.item() if result.dim() == 0 else result.tolist()


# --------------------------------------------------------------------------
# Divergence and acceptance rates (Section 3.1, Appendix A.5)
# --------------------------------------------------------------------------


def d_lk(p: Distribution, q: Distribution):
    """D_LK divergence (Definition 2), reduced over the last (vocabulary) dim.

    Equal to ``1 - sum_x min(p(x), q(x))`` by Lemma 3; computed in the
    Definition 2 form ``0.5 * sum_x |p(x) - q(x)|``, which is exactly symmetric
    and exactly 0 when ``p == q`` in floating point (Corollary 4).  Returns a
    tensor of shape ``broadcast(p, q).shape[:-1]`` for tensor input, else a
    float / list.
    """
    pt, qt = _pair(p, q)
    return _output(0.5 * (pt - qt).abs().sum(dim=-1), p, q)


def acceptance_rate(p: Distribution, q: Distribution):
    """Per-prefix acceptance rate beta = sum_x min(p(x), q(x)) = 1 - D_LK(p, q) (Theorem 5)."""
    pt, qt = _pair(p, q)
    return _output(torch.minimum(pt, qt).sum(dim=-1), p, q)


def expected_alpha(p_rows: Distribution, q_rows: Distribution) -> float:
    """alpha = E(beta) = E(sum_x min(p, q)) (Corollary 6), the mean over all rows.

    ``p_rows``/``q_rows`` have shape ``(..., V)``; every leading index is one
    prefix (the paper averages over prefixes generated by M_p).  Returns a float.
    """
    pt, qt = _pair(p_rows, q_rows, "p_rows", "q_rows")
    beta = torch.minimum(pt, qt).sum(dim=-1)
    if beta.numel() == 0:
        shape = tuple(torch.broadcast_shapes(pt.shape, qt.shape))
        raise ValueError(f"p_rows and q_rows must contain at least one row, got broadcast shape {shape}")
    return float(beta.detach().to(torch.float64).mean())


def lenient_acceptance_rate(p: Distribution, q: Distribution, l: float):  # noqa: E741
    """Acceptance rate with lenience l (Appendix A.5): sum_x min(p(x) / l, q(x)).

    The draft x ~ q is accepted when ``l * q(x) <= p(x)``, else with probability
    ``p(x) / (l * q(x))``.  ``l`` must be in (0, 1]; ``l = 1`` is Theorem 5.
    """
    lv = _lenience(l)
    pt, qt = _pair(p, q)
    return _output(torch.minimum(pt / lv, qt).sum(dim=-1), p, q)


def gumbel_acceptance_rate(p: Distribution, q: Distribution):
    """Acceptance rate of Gumbel-max coupling: P(argmax(log p + G) == argmax(log q + G)) for shared Gumbel G.

    Not in the paper: the verifier of verifiers/coupled.py. With E_y = exp(-G_y) ~ Exp(1), both pick x iff
    E_y > E_x * max(p_y/p_x, q_y/q_x) for every y, so P = sum_x 1 / sum_y max(p_y/p_x, q_y/q_x), at most
    sum min(p, q) (no coupling beats the maximal one). Sorting y by p_y/q_y splits the max into two cumulative
    sums, O(V log V) per row instead of O(V^2).
    """
    pt, qt = _pair(p, q)
    pt, qt = torch.broadcast_tensors(pt, qt)
    ratio = torch.where(qt > 0, pt / qt.clamp_min(torch.finfo(qt.dtype).tiny), torch.inf)
    ratio = torch.where((pt == 0) & (qt == 0), 0.0, ratio)
    order = ratio.argsort(dim=-1, descending=True)
    ps, qs = pt.gather(-1, order), qt.gather(-1, order)
    p_at_or_above = ps.cumsum(dim=-1)  # sum of p_y over y with ratio >= ratio_x: there max = p_y / p_x
    q_below = qs.sum(dim=-1, keepdim=True) - qs.cumsum(dim=-1)  # the rest: max = q_y / q_x
    both = (ps > 0) & (qs > 0)
    total = p_at_or_above / torch.where(both, ps, 1.0) + q_below / torch.where(both, qs, 1.0)
    return _output(torch.where(both, 1.0 / total, 0.0).sum(dim=-1), p, q)


# --------------------------------------------------------------------------
# Walltime / operations analysis (Sections 3.1 - 3.5)
# --------------------------------------------------------------------------


def expected_tokens_per_call(alpha: float, gamma: int) -> float:
    """E(# generated tokens) per run of Algorithm 1 (Equation 1): (1 - alpha^(gamma+1)) / (1 - alpha).

    The mean of a geometric variable capped at ``gamma + 1``.  At ``alpha = 1``
    the limit ``gamma + 1`` is returned; ``gamma = 0`` (no drafting) gives 1.
    Computed with expm1/log to stay accurate for alpha close to 1.
    """
    a = _alpha(alpha)
    g = _integer("gamma", gamma, 0)
    if a == 1.0:
        return float(g + 1)
    if a == 0.0:
        return 1.0
    # 1 - a is exact for a in [0.5, 1) (Sterbenz); expm1 avoids cancellation in 1 - a^(g+1).
    return -math.expm1((g + 1) * math.log(a)) / (1.0 - a)


def walltime_factor(alpha: float, gamma: int, c: float, verify_cost: float = 1.0) -> float:
    """Expected walltime improvement factor (Theorem 8): (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma*c + 1)).

    ``gamma >= 0`` (``gamma = 0`` is plain decoding, factor 1), ``c >= 0``.
    Assumes enough compute for gamma + 1 parallel M_p runs and long generations. ``verify_cost`` relaxes that
    assumption: the time of one M_p run over gamma + 1 tokens in units of a single-token run (the paper's 1;
    larger on hardware without spare parallelism, e.g. a CPU), giving E(tokens) / (gamma*c + verify_cost).
    """
    a = _alpha(alpha)
    g = _integer("gamma", gamma, 0)
    cv = _nonneg("c", c)
    v = _real("verify_cost", verify_cost, "> 0")
    if not v > 0:
        raise ValueError(f"verify_cost must be > 0, got {verify_cost!r}")
    return expected_tokens_per_call(a, g) / (g * cv + (1.0 if g == 0 else v))


def operations_factor(alpha: float, gamma: int, c_hat: float) -> float:
    """Expected factor of increase in total arithmetic operations (Theorem 10).

    ``(1 - alpha)(gamma*c_hat + gamma + 1) / (1 - alpha^(gamma+1))``; at
    ``alpha = 1`` the limit ``(gamma*c_hat + gamma + 1) / (gamma + 1)``.
    """
    a = _alpha(alpha)
    g = _integer("gamma", gamma, 0)
    ch = _nonneg("c_hat", c_hat)
    return (g * ch + g + 1.0) / expected_tokens_per_call(a, g)


def min_improvement_factor(alpha: float, c: float) -> float:
    """Corollary 9 bound (1 + alpha) / (1 + c), i.e. Theorem 8 at gamma = 1.

    The optimal gamma's factor is at least this.  It exceeds 1 iff alpha > c,
    which is exactly when speculative decoding can improve walltime; for
    ``alpha <= c`` the value (<= 1) is returned as is, not clipped.
    """
    a = _alpha(alpha)
    cv = _nonneg("c", c)
    return (1.0 + a) / (1.0 + cv)


def optimal_gamma(alpha: float, c: float, max_gamma: int = DEFAULT_MAX_GAMMA) -> OptimalGamma:
    """Integer gamma in [1, max_gamma] maximising Theorem 8, found by exhaustive search (Section 3.5).

    Returns ``OptimalGamma(gamma, factor)``.  Ties go to the smallest gamma
    (fewest wasted operations, Theorem 10).

    No improvement: by Corollary 9 some gamma >= 1 beats plain decoding iff
    ``alpha > c`` (if gamma helps, every smaller gamma helps, so gamma = 1
    decides).  When ``alpha <= c`` this returns ``OptimalGamma(0, 1.0)``:
    gamma = 0 means "do not speculate", and 1.0 is the factor of plain decoding.

    When ``c == 0`` (or ``alpha == 1`` with ``c < 1``) the factor grows with
    gamma without bound or plateau, so the result is ``max_gamma`` itself.
    """
    a = _alpha(alpha)
    cv = _nonneg("c", c)
    m = _integer("max_gamma", max_gamma, 1)
    if not a > cv:
        return OptimalGamma(0, 1.0)
    best_g, best_f = 1, walltime_factor(a, 1, cv)
    for g in range(2, m + 1):
        f = walltime_factor(a, g, cv)
        if f > best_f:
            best_g, best_f = g, f
    return OptimalGamma(best_g, best_f)

"""Pure functions from logits to probabilities and tokens. The same transform serves p (target) and q (drafter)."""
from __future__ import annotations

import torch

from .types import SamplingParams


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, then top-p (nucleus), as Hugging Face's warpers do. logits: [..., V]."""
    if params.temperature > 0 and params.temperature != 1.0:
        logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]  # [..., 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(dim=-1)
        # drop a token when the mass strictly before it already reaches top_p (so the top-1 always stays)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        drop_sorted = mass_before >= params.top_p
        drop = drop_sorted.scatter(-1, sorted_idx, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution tokens are drawn from. Greedy params give the untempered softmax (used by BiLD/lenience)."""
    if params.greedy:
        return logits.float().softmax(dim=-1)
    return filter_logits(logits.float(), params).softmax(dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row. probs: [..., V] -> [...] long."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


def choose(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """Argmax when greedy, else a draw from the filtered distribution. logits: [..., V] -> [...]."""
    if params.greedy:
        return logits.argmax(dim=-1)
    return sample(probs_from_logits(logits, params), generator)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)) over the last dim (Leviathan Algorithm 1). Falls back to p where p == q (mass 0)."""
    r = (p - q).clamp_min_(0.0)
    mass = r.sum(dim=-1, keepdim=True)
    return torch.where(mass > 0, r / torch.where(mass > 0, mass, 1.0), p)

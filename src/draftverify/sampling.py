"""Pure functions from logits to probabilities and tokens. The same transform serves p (target) and q (drafter)."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch

from .errors import DraftVerifyError
from .types import RowParams, SamplingParams


def row_params(params: SamplingParams | RowParams | list[SamplingParams]) -> SamplingParams | RowParams:
    """One SamplingParams when every row shares the settings (seeds aside), else RowParams."""
    rows = params.rows if isinstance(params, RowParams) else params
    if isinstance(rows, SamplingParams):
        return rows
    rows = list(rows)
    if not rows or not all(isinstance(p, SamplingParams) for p in rows):
        raise DraftVerifyError("per-row sampling settings must be a non-empty list of SamplingParams")
    return rows[0] if len({RowParams.key(p) for p in rows}) == 1 else RowParams(rows)


def params_rows(params: SamplingParams | RowParams, batch: int) -> list[SamplingParams]:
    """Each row's settings [B]."""
    return list(params.rows) if isinstance(params, RowParams) else [params] * batch


def by_rows(params: SamplingParams | RowParams, fn, rows: torch.Tensor) -> torch.Tensor:
    """fn(settings, row indices) -> that group's result [G, ...], assembled over the rows (dim 0)."""
    if isinstance(params, SamplingParams):
        return fn(params, None)
    out = None
    for p, index in params.groups():
        part = fn(p, index.to(rows.device))
        if out is None:
            out = part.new_empty((rows.shape[0],) + tuple(part.shape[1:]))
        out[index.to(out.device)] = part
    assert out is not None  # a RowParams holds at least one row
    return out


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, then top-p (nucleus), as Hugging Face's warpers do. logits: [..., V]."""
    if params.temperature > 0 and params.temperature != 1.0:
        logits = logits / max(params.temperature, torch.finfo(logits.dtype).tiny)  # 5e-324 is 0 in float32
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]  # [..., 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(dim=-1)
        # drop a token when the mass strictly before it already reaches top_p (so the top-1 always stays)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        drop_sorted = mass_before >= params.top_p
        drop_sorted[..., 0] = False  # also when top_p rounds to 0 in the logits' dtype (5e-324 in float32)
        drop = drop_sorted.scatter(-1, sorted_idx, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def argmax(values: torch.Tensor) -> torch.Tensor:
    """values.argmax(dim=-1): the first maximal index, as torch's. A float32 / float64 tensor on the CPU goes
    through NumPy, whose vectorised argmax is several times faster over a vocabulary than torch's CPU kernel; the
    greedy verifier and the draft model's drafts take one every step."""
    if values.device.type != "cpu" or values.dtype not in (torch.float32, torch.float64) or values.requires_grad:
        return values.argmax(dim=-1)
    return torch.as_tensor(values.numpy().argmax(axis=-1))  # a 0-d tensor for one [V] vector


def with_host_array(view: torch.Tensor, array: np.ndarray) -> torch.Tensor:
    """view (a tensor over `array`'s memory, torch.from_numpy(array)) marked with the array, so that host_array
    finds it without a torch call."""
    view._host_array = array  # type: ignore[attr-defined]
    return view


def host_array(values: torch.Tensor) -> np.ndarray | None:
    """The NumPy array a host backend's logits view was made over (with_host_array: llama.cpp's output buffer),
    or None for any other tensor, a slice of such a view included. Read without a torch call: right after a
    llama.cpp forward, torch's code and objects are cold and a single call costs many times what it costs in a
    tight loop."""
    return getattr(values, "_host_array", None)


def argmax_lists(values: torch.Tensor) -> list:
    """argmax(values) as Python ints, nested over the leading dimensions: on the CPU one NumPy call and no tensor
    made (what a host-side verdict reads), elsewhere one device-to-host copy."""
    host = host_array(values)
    if host is not None:
        return host.argmax(axis=-1).tolist()
    if not values.is_cpu or values.dtype not in (torch.float32, torch.float64) or values.requires_grad:
        return values.argmax(dim=-1).tolist()
    return values.numpy().argmax(axis=-1).tolist()


def probs_from_logits(logits: torch.Tensor, params: SamplingParams | RowParams) -> torch.Tensor:
    """The distribution tokens are drawn from. Greedy params give the untempered softmax (used by BiLD/lenience).
    RowParams: logits [B, ..., V], each row by its own settings."""
    if isinstance(params, RowParams):
        return by_rows(params, lambda p, rows: probs_from_logits(logits[rows], p), logits)
    if params.greedy:
        return logits.float().softmax(dim=-1)
    # shifted by each row's top logit (the same softmax, top-k and top-p): a temperature so small that logits / T
    # overflows then leaves the top token(s) instead of inf - inf = nan
    logits = logits.float()
    return filter_logits(logits - logits.amax(dim=-1, keepdim=True), params).softmax(dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row. probs: [..., V] -> [...] long."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


def choose(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """Argmax when greedy, else a draw from the filtered distribution. logits: [..., V] -> [...]."""
    if params.greedy:
        return argmax(logits)
    return sample(probs_from_logits(logits, params), generator)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)) over the last dim (Leviathan Algorithm 1). Falls back to p where p == q (mass 0)."""
    r = (p - q).clamp_min_(0.0)
    mass = r.sum(dim=-1, keepdim=True)
    return torch.where(mass > 0, r / torch.where(mass > 0, mass, 1.0), p)


# ---- position-keyed (coupled) sampling ------------------------------------------------------------------------
# A sampled token at decoder position t is argmax(log p + G_t) (Gumbel-max trick: an exact draw from p), with
# G_t [V] a pure function of (seed, t). The drafter draws with the same G_t over its own q, so a draft token
# is kept iff it equals the target's draw, and the text is the target's own Gumbel-max sample: it depends on
# neither the drafter nor where the draft boundaries fall (gamma auto picks them from wall-clock timings).

_MASK64 = (1 << 64) - 1


def position_seed(seed: int, position: int) -> int:
    """splitmix64 of (seed, position): nearby positions and seeds get unrelated generator states."""
    z = (seed * 0x9E3779B97F4A7C15 + position + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) & ((1 << 63) - 1)


_NOISE_CACHE: OrderedDict[tuple[int, int, int], torch.Tensor] = OrderedDict()
_NOISE_CACHE_ROWS = 48  # > the longest draft + bonus: each position's noise is drawn about once per generation


def _noise_row(seed: int, position: int, vocab_size: int) -> torch.Tensor:
    """G_t [V] float32 on the CPU. The drafter and the verifier ask for the same positions, and positions past
    a rejection are asked for again next step, so recent rows are kept rather than drawn again."""
    key = (seed, position, vocab_size)
    row = _NOISE_CACHE.get(key)
    if row is None:
        gen = torch.Generator().manual_seed(position_seed(seed, position))
        u = torch.rand(vocab_size, generator=gen, dtype=torch.float64).clamp_(min=1e-300)  # U(0, 1), never 0
        row = _NOISE_CACHE[key] = (-(-u.log()).log()).float()
        if len(_NOISE_CACHE) > _NOISE_CACHE_ROWS:
            _NOISE_CACHE.popitem(last=False)
    return row


def gumbel_noise(
    seed: int, start: int, count: int, vocab_size: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Gumbel noise G_t [count, V] for positions start .. start+count-1; drawn on the CPU so a seed means the
    same noise on every device."""
    if count == 0:
        return torch.empty(0, vocab_size, device=device)
    return torch.stack([_noise_row(seed, t, vocab_size) for t in range(start, start + count)]).to(device)


def gumbel_argmax(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """argmax(log probs + noise): a draw from probs when noise is standard Gumbel. probs [..., V] -> [...]."""
    return argmax(probs.float().log() + noise)


def coupling_seed(generator: torch.Generator | None) -> int:
    """The key of coupled noise: the loop's generator holds the user's seed (or a fresh one when unseeded)."""
    if generator is None:
        raise DraftVerifyError("coupled sampling needs the seeded generator that generate() creates; pass one")
    return generator.initial_seed()


def draw(probs: torch.Tensor, params: SamplingParams, generator: torch.Generator | None, position: int) -> torch.Tensor:
    """A drafter's token at decoder position `position`: argmax when greedy, the coupled Gumbel-max draw when
    params.coupled, else a plain draw from the generator's stream. probs [B, V] -> [B]."""
    if params.greedy:
        return argmax(probs)
    if params.coupled:
        noise = gumbel_noise(coupling_seed(generator), position, 1, probs.shape[-1], probs.device)[0]  # [V]
        return gumbel_argmax(probs, noise)
    return sample(probs, generator)


def draw_next(probs: torch.Tensor, state, offset: int) -> torch.Tensor:
    """A drafter's token `offset` positions after the last committed one of each row (DecodingState `state`):
    each row by its own settings, its coupled noise keyed by its own seed and position. probs [B, V] -> [B]."""
    positions = (state.lengths + offset).tolist()
    seeds = row_seeds(state.seeds, state.generator, len(positions)) if not state.params.greedy else None

    def draw_rows(params: SamplingParams, rows: torch.Tensor | None) -> torch.Tensor:
        part = probs if rows is None else probs[rows]
        if not params.coupled:
            return draw(part, params, state.generator, 0)
        picked = range(len(positions)) if rows is None else rows.tolist()
        assert seeds is not None  # a coupled row is not greedy, so neither is the batch: its seeds were drawn
        noise = torch.stack([gumbel_noise(seeds[b], positions[b], 1, probs.shape[-1], probs.device)[0] for b in picked])
        return gumbel_argmax(part, noise)

    return by_rows(state.params, draw_rows, probs)


def row_seeds(seeds: list[int] | None, generator: torch.Generator | None, rows: int) -> list[int]:
    """Per-row coupling seeds of a batch: the given ones, else the generator's seed for every row."""
    return list(seeds) if seeds is not None else [coupling_seed(generator)] * rows

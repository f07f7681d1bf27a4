"""Keep or drop KV-cache positions for every cache Hugging Face models use here (decoder-only and encoder-decoder).

We edit each self-attention layer's key/value tensors [B, heads, S, head_dim] directly instead of calling
`Cache.crop`: a tree needs a gather along the sequence axis (keep the accepted branch, drop its siblings), which
the cache classes do not offer, and one code path for both keeps the two consistent. Cross-attention states of
encoder-decoder caches depend only on the source and are never touched.

A preallocated cache (HF StaticCache, gpt-fast style) is indexed by position: dropping a tail is moving its write
position back (stale slots beyond it are hidden by the causal mask and overwritten by the next forward), keeping a
tree branch is copying the branch's slots down in place, so the tensors keep their addresses for torch.compile.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer, EncoderDecoderCache, StaticCache, StaticLayer

from ...errors import DraftVerifyError


def new_cache(is_encoder_decoder: bool, config=None, capacity: int | None = None) -> Cache:
    """A fresh growable cache, or with capacity a preallocated one of that many positions (decoder-only models).
    Encoder-decoder models keep cross-attention states separately."""
    if capacity is not None:
        if is_encoder_decoder:
            raise DraftVerifyError("a preallocated (static) KV cache is supported for decoder-only models only")
        return StaticCache(config=config, max_cache_len=capacity)
    if is_encoder_decoder:
        return EncoderDecoderCache(DynamicCache(), DynamicCache())
    return DynamicCache()


def self_attention_layers(cache: Cache) -> list:
    """The layers whose sequence axis grows with the decoder-side tokens."""
    inner = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
    layers = [layer for layer in inner.layers if getattr(layer, "is_initialized", False)]
    for layer in layers:
        if type(layer) not in (DynamicLayer, StaticLayer):  # sliding-window layers have already dropped old positions
            raise DraftVerifyError(
                f"this model's KV cache uses {type(layer).__name__} layers, which cannot roll back; "
                "use a model without sliding-window or linear attention"
            )
    return layers


def cache_length(cache: Cache) -> int:
    """Positions held by the (decoder self-attention) cache, as the cache itself reports them (for checks)."""
    return cache.get_seq_length()


def keep_positions(cache: Cache, length: int, held: int) -> None:
    """Drop every position at index >= length of a cache holding `held` positions (a chain's rollback)."""
    if not 0 <= length <= held:
        raise DraftVerifyError(f"cannot keep {length} positions of a KV cache holding {held}")
    if length == held:
        return
    for layer in self_attention_layers(cache):
        if isinstance(layer, StaticLayer):
            layer.cumulative_length.fill_(length)
            continue
        layer.keys = layer.keys[..., :length, :]
        layer.values = layer.values[..., :length, :]


def gather_positions(cache: Cache, start: int, offsets: torch.Tensor, held: int) -> None:
    """Keep positions [0, start) then start + offsets[b] in order (a tree's accepted branch), drop the rest.

    offsets: [B, k] or [k] long, each in [0, held - start) (not checked: that would cost a host sync per step);
    rows may keep different positions but as many.
    """
    if offsets.dim() == 1:
        offsets = offsets[None]
    if not 0 <= start <= held:
        raise DraftVerifyError(f"cannot gather after position {start} of a KV cache holding {held}")
    if offsets.shape[1] > held - start:
        raise DraftVerifyError(f"cannot keep {offsets.shape[1]} of the {held - start} positions after {start}")
    for layer in self_attention_layers(cache):
        keys, values = _pick(layer.keys, start, offsets), _pick(layer.values, start, offsets)  # [B, h, k, d]
        if isinstance(layer, StaticLayer):  # copy the branch down in place, keeping the tensors' addresses
            end = start + offsets.shape[1]
            layer.keys[..., start:end, :] = keys
            layer.values[..., start:end, :] = values
            layer.cumulative_length.fill_(end)
            continue
        layer.keys = torch.cat([layer.keys[..., :start, :], keys], dim=2)
        layer.values = torch.cat([layer.values[..., :start, :], values], dim=2)


def _pick(states: torch.Tensor, start: int, offsets: torch.Tensor) -> torch.Tensor:
    """states [B, h, S, d], offsets [B, k] -> states at positions start + offsets: [B, h, k, d]."""
    batch, heads, _, dim = states.shape
    index = (start + offsets).to(states.device)[:, None, :, None].expand(batch, heads, -1, dim)
    return states.gather(2, index)


def cache_argument(model) -> str:
    """The name a model's forward takes its KV cache by: `cache` from transformers 5.24 on (`past_key_values` is then
    deprecated, with a warning per call), `past_key_values` before."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def returned_cache(out):
    """The KV cache a forward returned, under either name (see cache_argument)."""
    cache = out.get("cache", None)
    return cache if cache is not None else out.get("past_key_values", None)

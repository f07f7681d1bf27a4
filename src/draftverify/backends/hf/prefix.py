"""A deep prompt (P-tuning v2 / prefix tuning): per-layer keys and values that some positions of a forward attend
to, without being stored in the KV cache or changing the model.

Every attention layer of a Hugging Face decoder passes its new keys and values through `cache.update(...)` and
attends to what it returns; during the forward we prepend the layer's prefix to that return value, so the prefix
sits in key columns [0, P) of every layer. The attention mask (CachedLM._mask, or a training mask) then decides
who sees those columns: BiTA's mask tokens do, ordinary tokens never, so their outputs are unchanged.
The prefix keys are used as given (no rotary embedding is applied to them): they are learned post-rotation.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from transformers.cache_utils import Cache

from ...errors import DraftVerifyError
from ...types import PrefixKV


def prefix_length(prefix: PrefixKV | None) -> int:
    return 0 if not prefix else prefix[0][0].shape[-2]


@contextmanager
def attend_prefix(cache: Cache, prefix: PrefixKV | None) -> Iterator[None]:
    """Within the block, every layer's attention over `cache` also sees that layer's prefix, in key columns [0, P)."""
    if not prefix:
        yield
        return
    original = cache.update

    def update(key_states, value_states, layer_idx, *args, **kwargs):
        keys, values = original(key_states, value_states, layer_idx, *args, **kwargs)  # [B, h, S, d]
        if layer_idx >= len(prefix):
            raise DraftVerifyError(
                f"the prefix has {len(prefix)} layers but the model has more; it was made for another model"
            )
        pk, pv = prefix[layer_idx]  # [h, P, d]
        batch = keys.shape[0]
        pk = pk.to(keys.dtype)[None].expand(batch, -1, -1, -1)
        pv = pv.to(values.dtype)[None].expand(batch, -1, -1, -1)
        return torch.cat([pk, keys], dim=2), torch.cat([pv, values], dim=2)

    cache.update = update  # an instance attribute shadows the method for this forward only
    try:
        yield
    finally:
        del cache.update


def prefix_columns(mask: torch.Tensor, sees_prefix: torch.Tensor, length: int) -> torch.Tensor:
    """Prepend `length` prefix columns to a bool mask [..., n, keys]: True on the rows where sees_prefix [n] is."""
    cols = sees_prefix.to(mask.device)[:, None].expand(*mask.shape[:-1], length)
    return torch.cat([cols, mask], dim=-1)

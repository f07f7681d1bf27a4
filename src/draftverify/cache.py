"""KV-cache rollback for every cache Hugging Face models use here (decoder-only and encoder-decoder)."""
from __future__ import annotations

from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache

from .errors import DraftVerifyError


def new_cache(is_encoder_decoder: bool) -> Cache:
    """A fresh growable cache; encoder-decoder models keep cross-attention states separately."""
    if is_encoder_decoder:
        return EncoderDecoderCache(DynamicCache(), DynamicCache())
    return DynamicCache()


def cache_length(cache: Cache) -> int:
    """Number of (decoder self-attention) positions held."""
    return cache.get_seq_length()


def crop_cache(cache: Cache, length: int) -> None:
    """Drop every position at index >= length. Cross-attention states of encoder-decoder caches are kept.

    Rollback is a crop because positions are appended in order: rejected draft positions are the tail.
    """
    if length < 0:
        raise DraftVerifyError(f"cannot crop a KV cache to a negative length ({length})")
    held = cache.get_seq_length()
    if length > held:
        raise DraftVerifyError(f"cannot crop a KV cache holding {held} positions to {length}: it would have to grow")
    if length == held:
        return
    try:
        cache.crop(length - held)  # transformers 5: a negative count of positions to drop
    except ValueError as err:  # sliding-window layers that already dropped states cannot roll back
        raise DraftVerifyError(
            f"this model's KV cache cannot roll back ({err}); use a model without sliding-window attention "
            "or keep prompt + new tokens within its window"
        ) from err

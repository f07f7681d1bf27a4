"""A trained piece's fingerprint ties it to its target whatever precision either loads at: a piece trained on a GPU's
bfloat16 target matches the CPU's float32 copy and back, pieces saved with the older float16 hash still match a
float32 or float16 target, and another target never matches."""

from __future__ import annotations

import torch

from draftverify.drafters.fingerprint import fingerprint_matches, weight_fingerprint


def _fp16_weights(seed: int) -> torch.Tensor:
    torch.manual_seed(seed)
    return (torch.randn(64, 32) * 0.05).half()  # as exported: fp16 on disk


def test_every_precision_a_target_loads_at_has_one_fingerprint():
    stored = _fp16_weights(0)
    as_loaded = {dtype: stored.to(dtype) for dtype in (torch.float32, torch.bfloat16, torch.float16)}
    prints = {weight_fingerprint(w) for w in as_loaded.values()}
    assert len(prints) == 1
    trained_on_gpu = weight_fingerprint(as_loaded[torch.bfloat16])
    assert all(fingerprint_matches(trained_on_gpu, w) for w in as_loaded.values())


def test_the_older_float16_hash_still_matches_float32_and_float16_targets():
    stored = _fp16_weights(0)
    legacy = weight_fingerprint(stored.float(), torch.float16)
    assert fingerprint_matches(legacy, stored.float()) and fingerprint_matches(legacy, stored)


def test_another_target_does_not_match():
    mine, other = _fp16_weights(0), _fp16_weights(1)
    assert not fingerprint_matches(weight_fingerprint(mine), other.float())
    assert not fingerprint_matches(weight_fingerprint(mine, torch.float16), other.to(torch.bfloat16))

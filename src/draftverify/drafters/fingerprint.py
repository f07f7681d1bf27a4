"""Fingerprints that tie a trained piece (heads, BiTA adapter, NAT drafter) to the target it was trained on, whatever
dtype and device either is loaded at.

The fingerprint is a hash of one of the target's weight matrices rounded to bfloat16: every precision a target loads
at (float32, float16, bfloat16) rounds to the same bfloat16 values, so a piece trained on a GPU's bfloat16 target
runs on the CPU's float32 one and back. Pieces saved before this hashed the float16 rounding; they still match a
target loaded in float32 or float16.
"""

from __future__ import annotations

import hashlib

import torch


def weight_fingerprint(weight: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> str:
    """sha256 (16 hex digits) of weight rounded to dtype (a 16-bit float)."""
    rounded = weight.detach().to("cpu", dtype).contiguous()
    return hashlib.sha256(rounded.view(torch.int16).numpy().tobytes()).hexdigest()[:16]


def fingerprint_matches(stored: str, weight: torch.Tensor) -> bool:
    """Whether a piece's stored fingerprint is this weight's (the bfloat16 hash, or the float16 one of older pieces)."""
    return stored in (weight_fingerprint(weight), weight_fingerprint(weight, torch.float16))

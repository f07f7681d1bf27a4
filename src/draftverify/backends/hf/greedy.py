"""Hugging Face's own greedy generate on a left-padded batch: the reference the batch bench times our rows against,
and how BiTA's recipe gets a frozen target's continuations to learn from."""

from __future__ import annotations

import torch

from ...types import left_padded


def hf_greedy(
    model, rows: list[list[int]], pad: int, eos: int | list[int] | None, max_new_tokens: int, min_new_tokens: int = 0
) -> tuple[list[list[int]], int]:
    """model.generate, greedy, on `rows` (token id lists) left-padded with `pad` into one batch [B, L]. Returns each
    row's new tokens up to and including its first EOS (`eos`: an id, a list of ids, or None), and the generated
    width (the batch's longest continuation: the decode steps generate ran)."""
    eos_set = set([eos] if isinstance(eos, int) else (eos or []))
    ids, mask = left_padded(rows, pad, model.device)
    width = ids.shape[1]
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask.long(),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad,
            eos_token_id=eos,
            min_new_tokens=min_new_tokens,
        )
    new = []
    for row in out[:, width:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in eos_set), len(row))
        new.append(row[:cut])
    return new, out.shape[1] - width

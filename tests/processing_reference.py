"""The definitions of the logits processing (processing.py), written out one position at a time: the reference the
processors' tests compare with (each position from scratch, no draft, no batch)."""

from __future__ import annotations

from collections import Counter

import torch

from draftverify.processing import Processing


def processed_row(row: torch.Tensor, prompt: list[int], out: list[int], p: Processing, stops: set[int]) -> torch.Tensor:
    """One position's logits [V] processed, from the prompt and every token generated before it (out): the bias,
    then min_tokens (the stop tokens forbidden while fewer than min_tokens are out), then the penalties:
    repetition over prompt + out (a positive logit divided, a negative one multiplied), frequency x count and
    presence over out."""
    row = row.clone().double()
    for token, bias in p.bias:
        row[token] += bias
    if len(out) < p.min_tokens:
        for token in stops:
            row[token] = float("-inf")
    counts = Counter(out)
    seen = set(prompt) | set(out)
    for token in range(row.shape[0]):
        if token in seen:
            row[token] = row[token] / p.repetition_penalty if row[token] > 0 else row[token] * p.repetition_penalty
        row[token] -= p.frequency_penalty * counts[token] + p.presence_penalty * (counts[token] > 0)
    return row


@torch.no_grad()
def processed_greedy(model, prompt: list[int], new: int, p: Processing, eos: int) -> list[int]:
    """The target alone under processing p: greedy, one token at a time, recomputed from scratch each step."""
    stops = p.stops({eos})
    out: list[int] = []
    for _ in range(new):
        row = model(torch.tensor([prompt + out])).logits[0, -1]
        token = int(processed_row(row, prompt, out, p, stops).argmax())
        out.append(token)
        if token in stops:
            break
    return out

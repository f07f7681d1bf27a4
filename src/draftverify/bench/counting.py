"""Count model forwards with a pre-hook, so Hugging Face runners get the same columns as ours.

The hook sits on the target and draft modules for the whole run, so every runner (ours included) pays the same
few microseconds per forward. It records, per forward, how many input tokens were fed and how long the KV cache
was before the call; `step_accounting` turns that into drafted / accepted / rejected counts for HF's
(assisted) generate, whose every target forward verifies a draft (possibly empty) and emits >= 1 token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


def _cache_length(cache) -> int:
    if cache is None:
        return 0
    if hasattr(cache, "get_seq_length"):
        return int(cache.get_seq_length())
    try:  # legacy tuple cache: ((k, v), ...) with k [B, H, L, D]
        return int(cache[0][0].shape[-2])
    except (TypeError, IndexError, AttributeError):
        return 0


class ForwardCounter:
    """Counts forwards of exactly `model` (not of shallow copies sharing its hook dict, e.g. early-exit views)."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.calls: list[tuple[int, int]] = []  # (input tokens, cached tokens before the call)
        self._handle = model.register_forward_pre_hook(self._hook, with_kwargs=True)

    @torch.compiler.disable
    def _hook(self, module, args, kwargs):
        # kept out of torch.compile (bench --compile): traced, its int(cache length) would break the graph and
        # recompile the hook's frame for every new length
        if module is not self.model:
            return None
        ids = kwargs.get("input_ids", kwargs.get("decoder_input_ids"))
        if ids is None and args:
            ids = args[0]
        n_in = int(ids.shape[-1]) if isinstance(ids, torch.Tensor) else 0
        self.calls.append((n_in, _cache_length(kwargs.get("cache", kwargs.get("past_key_values")))))
        return None

    def reset(self) -> None:
        self.calls = []

    def take(self) -> list[tuple[int, int]]:
        calls, self.calls = self.calls, []
        return calls

    def remove(self) -> None:
        self._handle.remove()


@dataclass
class StepCounts:
    target_calls: int
    drafted: int
    accepted: int
    rejections: int


def step_accounting(calls: list[tuple[int, int]], prompt_length: int, new_tokens: int) -> StepCounts:
    """Per-step drafted / accepted counts of a Hugging Face generate run from its target forwards.

    HF keeps every committed token but the last in the cache between steps, so a step that starts with
    `cached` tokens in the cache had cached + 1 committed tokens and fed 1 pending token + d draft tokens
    (the first step feeds the whole prompt + d). Tokens emitted by step i = committed before step i+1 minus
    committed before step i; accepted = emitted - 1 (the target's own token), rejected when accepted < d.
    """
    if not calls:
        return StepCounts(0, 0, 0, 0)
    committed = [prompt_length] + [cached + 1 for _, cached in calls[1:]]
    drafted = [max(0, calls[0][0] - prompt_length)] + [max(0, n_in - 1) for n_in, _ in calls[1:]]
    ends = committed[1:] + [prompt_length + new_tokens]
    accepted = rejections = 0
    for start, end, d in zip(committed, ends, drafted):
        kept = min(max(0, end - start - 1), d)
        accepted += kept
        rejections += int(kept < d)
    return StepCounts(len(calls), sum(drafted), accepted, rejections)

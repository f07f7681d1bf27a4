"""CachedLM's compiled forward: one static graph per verify width bucket and cache window.

torch.compile (inductor freezing, static shapes) builds a graph per input shape, and on a CPU each takes tens of
seconds. So a forward is padded up to the next width bucket (padding sits after the real tokens, sees only itself
and is never kept), the preallocated cache's window is a power of two (window_for), and dynamo's recompile limit is
raised so a target and a draft of one class (one forward function) can hold all their graphs.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from ...types import TargetOutput
from .cache import keep_positions

WIDTH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def window_for(positions: int, capacity: int) -> int:
    """Slots to preallocate for a request of `positions` plus the widest verify: the next power of two (at least
    256), at most `capacity`. Every forward attends over all slots of a static cache, so a 2048-slot cache for a
    400-token request costs ~5x the attention it needs; powers of two bound the compiled shapes to a handful."""
    need = positions + WIDTH_BUCKETS[-1]
    return min(capacity, max(256, 1 << (need - 1).bit_length()))


GRAPH_ROOM = 256  # static graphs per forward function: every (model class, width bucket, window) pair is one


def compile_forward(model: PreTrainedModel):
    """torch.compile with inductor freezing: weights become constants, prepacked for the CPU GEMM kernels (without
    it a one-token forward gains nothing on a CPU). Dynamo keys graphs by the forward's code, which a target and a
    draft of one class share, so its recompile limit (8) is raised here: past it, later widths would run eager,
    silently. The limits are process-wide and only ever raised."""
    import torch._dynamo.config as dynamo

    dynamo.recompile_limit = max(dynamo.recompile_limit, GRAPH_ROOM)
    dynamo.accumulated_recompile_limit = max(dynamo.accumulated_recompile_limit, GRAPH_ROOM)
    return torch.compile(model, dynamic=False, options={"freezing": True})


def bucket(width: int) -> int:
    """The padded width a compiled forward runs at (the width itself beyond the last bucket)."""
    return next((b for b in WIDTH_BUCKETS if b >= width), width)


class CompiledWidths:
    """CachedLM's forward through its compiled graphs (mixed into CachedLM: reads its cache and _run)."""

    def _run_padded(self, tokens, position_ids, attention_mask, want_hidden) -> TargetOutput:
        """The compiled forward at the narrowest compiled width that holds n tokens; padding is dropped from the
        outputs and the cache. Wider than every compiled width: the eager forward on the same preallocated cache (a
        rare catch-up is cheaper run eagerly than compiled for once)."""
        batch, n = tokens.shape
        width = next((w for w in self.widths if w >= n), None)
        model = self._compiled if width is not None else self.model
        width = n if width is None else width
        tail = self.length - self.committed
        if position_ids is None:
            position_ids = torch.arange(self.length, self.length + n, device=self.device)[None]
        if attention_mask is None:
            attention_mask = torch.ones(n, tail + n, dtype=torch.bool).tril(diagonal=tail)
        pad = width - n
        tokens = torch.cat([tokens, tokens.new_zeros((batch, pad))], dim=1)
        last = position_ids[..., -1:].to(self.device)
        position_ids = torch.cat(
            [
                position_ids.to(self.device).expand(batch, n),
                (last + 1 + torch.arange(pad, device=self.device)).expand(batch, pad),
            ],
            dim=1,
        )
        mask = attention_mask.to(self.device)
        mask = mask.expand(batch, n, tail + n) if mask.dim() == 2 else mask
        wide = torch.zeros(batch, width, tail + width, dtype=torch.bool, device=self.device)
        wide[:, :n, : tail + n] = mask
        wide[:, n:, tail + n :] = torch.eye(pad, dtype=torch.bool, device=self.device)  # padding sees only itself
        out = self._run(
            tokens, keep=width, position_ids=position_ids, attention_mask=wide, want_hidden=want_hidden, model=model
        )
        if pad:
            keep_positions(self.cache, self.length - pad, self.length)
            self.length -= pad
        return TargetOutput(logits=out.logits[:, :n], hidden=None if out.hidden is None else out.hidden[:, :n])

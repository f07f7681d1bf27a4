"""CachedLM's rows layout: rows of different lengths in one cache (batches, continuous batching, ragged acceptance).

Layout between steps: every row's real positions sit in order, ending at the cache's last slot or before it (left
padding, as in Hugging Face's batched generation, plus gaps where a row accepted fewer drafts than another); slot
validity hides padding and gaps from every query, and positions are counted per row, so a gap changes nothing. A
step appends the same number of slots to every row; commit_rows keeps a different number per row, and the cache is
re-packed to the right (a copy of every layer) once gaps exceed max_gap_share. The plain layout (one row, no gaps:
`valid` None) is its no-gap case and answers the same row calls.
"""

from __future__ import annotations

import torch

from ...errors import DraftVerifyError
from ...types import PrefixKV, TargetOutput
from ..base import one_row
from .cache import new_cache, self_attention_layers
from .prefix import prefix_columns, prefix_length


class RowsLayout:
    """The row calls of the backend protocol for CachedLM (mixed into CachedLM: reads its cache and _run)."""

    @property
    def batched(self) -> bool:
        """True in the rows layout (several rows, or padding / gaps); False: one row, no gaps (plain layout)."""
        return self.valid is not None

    @property
    def row_length(self) -> torch.Tensor:
        """Real positions each row holds [B] (its next position id). The plain layout is the no-gap case of the
        rows layout: one row holding every slot."""
        if self.valid is None:
            return torch.tensor([self.length], device=self.device)
        return self._row_length

    def _check_rows(self) -> None:
        if self.is_encoder_decoder or not self.takes_positions:
            raise DraftVerifyError(
                f"batches of several rows need a decoder-only {self.role} that takes position_ids (Llama, Qwen2, "
                f"GPT-2, GPT-NeoX, ...); {type(self.model).__name__} runs one row at a time"
            )
        if self.capacity is not None:
            raise DraftVerifyError("batches of several rows run on a growing KV cache: drop --compile / capacity")

    def _start_rows(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        want_hidden: bool,
        prompt_logits: bool = False,
    ) -> torch.Tensor:
        self._check_rows()
        batch, width = input_ids.shape
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids, dtype=torch.bool)
        attention_mask = attention_mask.to(device=self.device, dtype=torch.bool)
        if attention_mask.shape != input_ids.shape or not bool(attention_mask[:, -1].all()):
            raise DraftVerifyError(
                "a batch's attention mask must match input_ids [B, L] and pad on the left "
                "(every row's last column is a real token)"
            )
        self.valid = torch.zeros(batch, 0, dtype=torch.bool, device=self.device)
        self._row_length = torch.zeros(batch, dtype=torch.long, device=self.device)
        self.row_committed = self._row_length.clone()
        real = attention_mask.sum(dim=1).tolist()  # [B] each row's prompt tokens
        if prompt_logits:  # row b's prompt positions but its last are the last real[b] - 1 prefilled columns
            self.prompt_logits = [torch.empty(0, self.vocab_size, device=self.device)] * batch
        if width > 1:
            out = self._forward_rows(
                input_ids[:, :-1],
                attention_mask[:, :-1],
                want_hidden,
                keep=width - 1 if prompt_logits else 1,
                keep_hidden=width - 1,
            )
            self.prefilled = TargetOutput(logits=out.logits[:, -1:], hidden=out.hidden)
            if prompt_logits:
                self.prompt_logits = [out.logits[b, width - count :] for b, count in enumerate(real)]
            self.commit_rows(attention_mask[:, :-1].sum(dim=1))
        return input_ids

    def _forward_rows(
        self,
        tokens: torch.Tensor,
        new_valid: torch.Tensor | None,
        want_hidden: bool,
        keep: int | None = None,
        keep_hidden: int | None = None,
    ) -> TargetOutput:
        batch, n = tokens.shape
        if self._chain_end != self.length:
            raise DraftVerifyError("a chain cannot follow a token tree in the rows layout's tail: commit first")
        if new_valid is None:
            new_valid = torch.ones(batch, n, dtype=torch.bool, device=self.device)
        new_valid = new_valid.to(self.device)
        steps = new_valid.long().cumsum(dim=1)  # [B, n]: real tokens up to and including each new slot
        position_ids = (self._row_length[:, None] + steps - 1).clamp_min(0)
        keys = torch.cat([self.valid, new_valid], dim=1)  # [B, length + n]
        causal = torch.ones(n, self.length + n, dtype=torch.bool, device=self.device).tril(diagonal=self.length)
        visible = causal[None] & keys[:, None, :]
        diagonal = torch.arange(n, device=self.device)
        visible[:, diagonal, self.length + diagonal] = True  # padding sees itself (an all-hidden row would be NaN)
        blocked = torch.tensor(torch.finfo(self.dtype).min, dtype=self.dtype, device=self.device)
        mask = torch.where(visible, torch.zeros((), dtype=self.dtype, device=self.device), blocked)[:, None]
        out = self._run(
            tokens,
            keep=n if keep is None else keep,
            position_ids=position_ids,
            additive_mask=mask,
            want_hidden=want_hidden,
            keep_hidden=keep_hidden,
        )
        self.valid = keys
        self._row_length = self._row_length + new_valid.sum(dim=1)
        self._chain_end = self.length
        return out

    def _forward_tree_rows(
        self,
        tokens: torch.Tensor,
        position_ids: torch.Tensor | None,
        attention_mask: torch.Tensor,
        want_hidden: bool,
        extra_embeds: torch.Tensor | None = None,
        prefix: PrefixKV | None = None,
    ) -> TargetOutput:
        """Rows layout: a token tree of one shape for every row (each row its own tokens [B, n]) after the tail,
        then extra_embeds [B, E, H] (E more positions; only they see `prefix`). position_ids count from `length`
        as for one row; each row's positions are shifted to its own length (the tail's tree slots take no positions
        of their own: row_length moves only when a branch is committed)."""
        batch, n = tokens.shape
        extra = 0 if extra_embeds is None else extra_embeds.shape[1]
        n += extra
        tail = self.length - self.committed
        mask = attention_mask.to(self.device)
        mask = mask[0] if mask.dim() == 3 else mask
        if tuple(mask.shape) != (n, tail + n):
            raise DraftVerifyError(
                f"attention mask must cover {n} new tokens x {tail + n} tail + new positions, got {tuple(mask.shape)}"
            )
        if position_ids is None:
            offsets = torch.arange(n, device=self.device)
        else:
            offsets = position_ids.to(self.device).reshape(-1)[-n:] - self._chain_end
        position_ids = self._row_length[:, None] + offsets[None]  # [B, n]
        keys = torch.cat([self.valid, torch.ones(batch, n, dtype=torch.bool, device=self.device)], dim=1)
        visible = torch.zeros(batch, n, self.length + n, dtype=torch.bool, device=self.device)
        visible[:, :, : self.committed] = self.valid[:, None, : self.committed]
        visible[:, :, self.committed :] = mask[None] & keys[:, None, self.committed :]
        if prefix:  # the prefix's key columns come first; only the extra positions see them
            visible = prefix_columns(visible, torch.arange(n, device=self.device) >= n - extra, prefix_length(prefix))
        blocked = torch.tensor(torch.finfo(self.dtype).min, dtype=self.dtype, device=self.device)
        additive = torch.where(visible, torch.zeros((), dtype=self.dtype, device=self.device), blocked)[:, None]
        out = self._run(
            tokens,
            keep=n,
            position_ids=position_ids,
            additive_mask=additive,
            want_hidden=want_hidden,
            extra_embeds=extra_embeds,
            prefix=prefix,
        )
        self.valid = keys
        return out

    def _commit_branches(self, kept: torch.Tensor) -> None:
        """Rows layout: row b keeps the tail offsets kept[b] (increasing, -1 padded: a tree's accepted branch,
        after the row's real fed tokens) and drops the rest of the tail."""
        kept = kept.to(self.device)
        kept = kept[None] if kept.dim() == 1 else kept
        if kept.shape[0] != self.valid.shape[0]:
            raise DraftVerifyError(f"kept has {kept.shape[0]} rows for a cache of {self.valid.shape[0]}")
        tail = self.length - self.committed
        if bool((kept >= tail).any()):
            raise DraftVerifyError(f"cannot keep tail offset {int(kept.max())} of a {tail}-position tail")
        keep = self.valid.clone()
        keep[:, self.committed :] = False
        real = kept >= 0
        rows = torch.arange(kept.shape[0], device=self.device)[:, None].expand_as(kept)[real]
        keep[rows, self.committed + kept[real]] = True
        keep &= self.valid
        counts = keep[:, self.committed :].sum(dim=1)
        self._pack(keep)
        self._row_length = self.row_committed + counts
        self.row_committed = self._row_length.clone()
        self._chain_end = self.length

    def commit_rows(self, counts: torch.Tensor | list[int]) -> None:
        """Row b keeps the first counts[b] real positions of its uncommitted tail [B]; then every row's positions
        are packed to the right again and the tail is settled."""
        if self.valid is None:
            self.commit(one_row(counts, "counts"))
            return
        counts = torch.as_tensor(counts, device=self.device)
        if self._chain_end != self.length:  # the tail was scored with a mask (extra positions): keep its prefixes
            width = int(counts.max())
            offsets = torch.arange(width, device=self.device)[None].expand(counts.shape[0], -1)
            self._commit_branches(torch.where(offsets < counts[:, None], offsets, -1))
            return
        self.truncate_rows(self.row_committed + counts)

    def truncate_rows(self, upto: torch.Tensor) -> None:
        """Batch mode: row b keeps its first upto[b] real positions (upto >= what it has committed) and drops the
        rest of its tail; the tail is settled (see _pack for the layout)."""
        if self.valid is None:
            self.commit(one_row(upto, "upto") - self.committed)
            return
        upto = upto.to(self.device)
        if bool((upto < self.row_committed).any()) or bool((upto > self._row_length).any()):
            raise DraftVerifyError("cannot keep fewer positions than a row committed, or more than it holds")
        rank = self.valid.long().cumsum(dim=1)  # real positions up to and including each slot
        keep = self.valid & (rank <= upto[:, None])
        self._pack(keep)
        self._row_length = upto.clone()
        self.row_committed = upto.clone()

    def drop_rows(self, keep_rows: torch.Tensor) -> None:
        """Keep only the rows where keep_rows [B] (bool) is True (finished rows leave the batch)."""
        if self.valid is None:
            if not bool(torch.as_tensor(keep_rows).all()):
                raise DraftVerifyError("cannot drop the only row of a one-row cache; start() the next request instead")
            return
        index = keep_rows.to(self.device).nonzero().flatten()
        for layer in self_attention_layers(self.cache):
            layer.keys = layer.keys.index_select(0, index)
            layer.values = layer.values.index_select(0, index)
        self.valid = self.valid.index_select(0, index)
        self._row_length = self._row_length.index_select(0, index)
        self.row_committed = self.row_committed.index_select(0, index)
        if self.length > self.committed:
            raise DraftVerifyError("drop rows between steps only (the tail is not committed)")
        self._pack(self.valid)

    def join_rows(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, prompt_logits: bool = False
    ) -> None:
        """Batch mode, between steps: prefill new left-padded rows [b, L] and append them to the batch (continuous
        batching). Their cache is left-padded to the batch's width (or the batch's to theirs) and concatenated.
        prompt_logits: keep their prefill's logits (take_prompt_logits; None for the rows already there)."""
        if self.length > self.committed:
            raise DraftVerifyError("rows join between steps only (the tail is not committed)")
        if self.valid is None:
            self._rows_layout()
        old = (self.cache, self.valid, self._row_length, self.row_committed, self.length)
        self.cache = new_cache(False, self.config, None)
        self.length = self.committed = self._chain_end = 0
        self.prompt_logits = None
        self._start_rows(input_ids, attention_mask, want_hidden=False, prompt_logits=prompt_logits)
        if self.prompt_logits is not None:
            self.prompt_logits = [None] * old[1].shape[0] + self.prompt_logits
        new_layers = self_attention_layers(self.cache) if self.length else []
        new_valid, new_len, new_committed, new_width = self.valid, self._row_length, self.row_committed, self.length
        cache, valid, row_length, row_committed, width = old
        old_layers = self_attention_layers(cache) if width else []
        total = max(width, new_width)
        if total:
            template = (old_layers or new_layers)[0]
            heads, dim = template.keys.shape[1], template.keys.shape[3]

            def widen(layer, rows: int, have: int, like) -> tuple[torch.Tensor, torch.Tensor]:
                if layer is None:  # nothing cached yet on this side (one-token prompts)
                    empty = like.keys.new_zeros((rows, heads, total, dim))
                    return empty, empty.clone()
                pad = layer.keys.new_zeros((rows, heads, total - have, dim))
                return torch.cat([pad, layer.keys], dim=2), torch.cat([pad, layer.values], dim=2)

            count = max(len(old_layers), len(new_layers))
            layers = []
            for i in range(count):
                a = old_layers[i] if i < len(old_layers) else None
                b = new_layers[i] if i < len(new_layers) else None
                ka, va = widen(a, valid.shape[0], width, b or a)
                kb, vb = widen(b, new_valid.shape[0], new_width, a or b)
                layers.append((torch.cat([ka, kb]), torch.cat([va, vb])))
            target_cache = cache if old_layers else self.cache
            for layer, (k, v) in zip(self_attention_layers(target_cache), layers):
                layer.keys, layer.values = k, v
            self.cache = target_cache
        else:
            self.cache = cache
        pad = lambda m, have: torch.cat([m.new_zeros((m.shape[0], total - have)), m], dim=1)  # noqa: E731
        self.valid = torch.cat([pad(valid, width), pad(new_valid, new_width)])
        self._row_length = torch.cat([row_length, new_len])
        self.row_committed = torch.cat([row_committed, new_committed])
        self.length = self.committed = self._chain_end = total

    def _rows_layout(self) -> None:
        """Plain -> rows layout (rows are about to join): every slot of the one row is valid."""
        self._check_rows()
        self.valid = torch.ones(1, self.length, dtype=torch.bool, device=self.device)
        self._row_length = torch.tensor([self.length], device=self.device)
        self.row_committed = torch.tensor([self.committed], device=self.device)
        self._chain_end = self.length

    def _pack(self, keep: torch.Tensor) -> None:
        """Keep the slots `keep` [B, held]: a slice when they form one right-aligned block, a cut of the unused
        end while gaps are few, else a re-pack of each row's kept slots (in order) to the right end of a cache of
        max(kept per row) slots."""
        count = keep.sum(dim=1)  # [B]
        width = int(count.max()) if count.numel() else 0
        held = keep.shape[1]
        slots = torch.arange(held, device=self.device)
        dest = torch.arange(width, device=self.device)[None]
        new_valid = dest >= (width - count[:, None])  # [B, width]
        # fast path: the kept slots already sit right-aligned in one contiguous block of slots (every row kept
        # the same number of this step's positions): a slice, no copy
        ends = torch.where(keep, slots + 1, 0).amax(dim=1) if held else count
        end = int(ends.max()) if ends.numel() else 0
        start = end - width
        if (
            bool((ends == end).all())
            and start >= 0
            and not bool(keep[:, :start].any())
            and bool((keep[:, start:end] == new_valid).all())
        ):
            for layer in self_attention_layers(self.cache):
                layer.keys = layer.keys[..., start:end, :]
                layer.values = layer.values[..., start:end, :]
        elif end and int(count.sum()) >= (1.0 - self.max_gap_share) * keep.shape[0] * end:
            # few gaps (rows that accepted fewer drafts than others): keep them, hidden by the validity mask, and
            # only cut the slots no row keeps at the end; a full re-pack copies every layer's keys and values
            for layer in self_attention_layers(self.cache):
                layer.keys = layer.keys[..., :end, :]
                layer.values = layer.values[..., :end, :]
            self.valid = keep[:, :end]
            self.length = self.committed = self._chain_end = end
            return
        else:
            order = torch.where(keep, slots, held + slots).argsort(dim=1)  # kept slots first, in order
            src_rank = (dest - (width - count[:, None])).clamp(0, max(held - 1, 0))  # [B, width]
            source = order.gather(1, src_rank)
            for layer in self_attention_layers(self.cache):
                b, h, _, d = layer.keys.shape
                index = source[:, None, :, None].expand(b, h, width, d)
                layer.keys = layer.keys.gather(2, index)
                layer.values = layer.values.gather(2, index)
        self.valid = new_valid
        self.length = self.committed = self._chain_end = width

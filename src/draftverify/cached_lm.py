"""A Hugging Face language model together with its KV cache: prefill once, score new tokens, keep what was accepted.

Serves the target and every drafter that runs a model, for decoder-only LMs and encoder-decoder models
(whose encoder runs once per generation and whose decoder is what we cache and roll back).

Positions are counted here, never read back from the cache object (a preallocated cache reports its capacity,
and a tree's positions are not its cache slots): `length` is how many positions the cache holds, `committed`
how many of those are settled. `forward` appends an uncommitted tail; `commit` keeps part of it and settles.

With `capacity` the cache is preallocated (HF StaticCache) and `commit` only moves its write position or copies a
tree branch down. With `compile` as well, the model's forward is compiled once per verify width bucket: widths are
padded up to the next bucket (padding sits after the real tokens, sees only itself, and is never kept), so a run
compiles a handful of graphs instead of one per draft length.
"""
from __future__ import annotations

import inspect

import torch
from transformers import PreTrainedModel

from .backends.base import is_backend
from .cache import gather_positions, keep_positions, new_cache, self_attention_layers
from .errors import DraftVerifyError
from .few_row_linear import few_row_linears
from .prefix import attend_prefix, prefix_columns, prefix_length
from .types import PrefixKV, TargetOutput


def context_limit(config) -> int | None:
    """Maximum decoder positions the model can attend to, or None for relative-position models (T5)."""
    for attr in ("max_position_embeddings", "n_positions", "max_target_positions"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


WIDTH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_CAPACITY = 4096  # preallocated positions for models whose config states no context length (T5-style)


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


class CachedLM:
    """One model, one cache. Invariant between steps: the cache holds every committed token but the last.

    The Hugging Face implementation of the backend protocol (backends/base.py: LMBackend)."""

    name = "hf"
    supports_rows = True  # decoder-only models that take position_ids (checked in start)
    exposes_hidden = True
    has_modules = True

    def __init__(self, model: PreTrainedModel, role: str = "target", capacity: int | None = None, compile: bool = False):
        if not isinstance(model, PreTrainedModel):
            raise DraftVerifyError(f"the {role} must be a Hugging Face PreTrainedModel, got {type(model).__name__}")
        if model.get_output_embeddings() is None:
            raise DraftVerifyError(
                f"the {role} ({type(model).__name__}) has no language-modelling head; load it with "
                "AutoModelForCausalLM or AutoModelForSeq2SeqLM"
            )
        self.model = model.eval()
        self.role = role
        self.config = model.config
        self.is_encoder_decoder = bool(getattr(self.config, "is_encoder_decoder", False))
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.max_positions = context_limit(self.config)
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        accepted = inspect.signature(model.forward).parameters
        self._keeps_logits = "logits_to_keep" in accepted
        # trees need each node's position to be its depth; models that derive positions from the cache alone
        # (T5's relative bias, BART / Marian decoders) cannot be told, so they score chains only
        self.takes_positions = "position_ids" in accepted and not self.is_encoder_decoder
        if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1):
            raise DraftVerifyError(f"the {role}'s cache capacity must be a positive integer, got {capacity!r}")
        if compile and capacity is None:
            raise DraftVerifyError("compile needs a preallocated cache: give a capacity (positions) as well")
        if capacity is not None and not self.takes_positions:
            raise DraftVerifyError(f"a preallocated cache needs a decoder-only {role} that takes position_ids")
        self.capacity = capacity  # the most slots a request may get
        self.window = capacity  # slots of this request's cache (check_fits sizes it to the request)
        self._compiled = compile_forward(model) if compile else None
        # compiled widths (compiling.plan narrows them to the method's); a wider forward runs eagerly
        self.widths: tuple[int, ...] = WIDTH_BUCKETS
        self.cache = None
        self.length = 0  # positions held in the cache
        self.committed = 0  # settled positions; [committed, length) is the tail of the last forwards
        self.encoder_outputs = None
        self.source_mask = None
        self.prefilled: TargetOutput | None = None  # set by start()
        # batch mode (start() with several rows or a padding mask): which cache slots hold a real token [B, length],
        # and how many real positions each row holds [B] (its next position id); None for one unpadded row
        self.valid: torch.Tensor | None = None
        self.row_length: torch.Tensor | None = None
        self.row_committed: torch.Tensor | None = None
        self.max_gap_share = 0.25  # batch mode: re-pack the cache once more than this share of its slots are gaps

    def check_fits(self, decoder_positions: int) -> None:
        if self.capacity is not None and decoder_positions > self.capacity:
            raise DraftVerifyError(
                f"the {self.role}'s preallocated cache holds {self.capacity} positions, but this request needs "
                f"{decoder_positions} (prompt + max_new_tokens) plus the verify width; raise its capacity"
            )
        if self.capacity is not None:
            self.window = window_for(decoder_positions, self.capacity)
        if self.max_positions is not None and decoder_positions > self.max_positions:
            raise DraftVerifyError(
                f"the {self.role} model attends to at most {self.max_positions} positions, but this request needs "
                f"{decoder_positions} (prompt + max_new_tokens); shorten the prompt or lower max_new_tokens"
            )

    @property
    def batched(self) -> bool:
        return self.valid is not None

    def start(self, input_ids: torch.Tensor, want_hidden: bool = False,
              attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Reset the cache and prefill. input_ids: [B, L] (the source for encoder-decoder models).

        Returns the committed decoder-side tokens [B, L0]: the prompt for decoder-only models,
        the decoder start token for encoder-decoder models. All but the last are now cached.
        `prefilled` then holds the logits at the last prefilled position [B, 1, V] and, when want_hidden, the
        hidden states at every prefilled position [B, L-1, H] (left padding included in a batch), or is None when
        nothing was prefilled (encoder-decoder, or a one-token prompt): drafters that read hidden states draft the
        first step from it (the blockwise heads from the last state, the NAT drafter from all of them).
        """
        self.cache = new_cache(self.is_encoder_decoder, self.config, self.window)
        self.length = self.committed = 0
        self.prefilled = None
        self.valid = self.row_length = self.row_committed = None
        if input_ids.shape[0] > 1 or attention_mask is not None:
            return self._start_rows(input_ids, attention_mask, want_hidden)
        if self.is_encoder_decoder:
            start_id = getattr(self.config, "decoder_start_token_id", None)
            if start_id is None:
                raise DraftVerifyError(f"the {self.role} is encoder-decoder but its config has no decoder_start_token_id")
            self.source_mask = torch.ones_like(input_ids)
            self.encoder_outputs = self.model.get_encoder()(input_ids=input_ids, attention_mask=self.source_mask)
            return torch.full((input_ids.shape[0], 1), start_id, dtype=torch.long, device=input_ids.device)
        if input_ids.shape[1] > 1:
            self.prefilled = self._run(input_ids[:, :-1], keep=1, want_hidden=want_hidden, keep_hidden=input_ids.shape[1] - 1)
            self.commit(input_ids.shape[1] - 1)
        return input_ids

    def forward(
        self,
        tokens: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        want_hidden: bool = False,
        new_valid: torch.Tensor | None = None,
        extra_embeds: torch.Tensor | None = None,
        prefix: PrefixKV | None = None,
    ) -> TargetOutput:
        """Append tokens [B, n] to the cache's tail; return their next-token logits [B, n, V] (and hidden [B, n, H]).

        new_valid (batch mode only): bool [B, n], False for padding among the new tokens (a row that has fewer
        tokens to feed is left-padded); padding takes no position and no later token ever sees it.

        position_ids: [B or 1, n] absolute positions (default: length, length + 1, ...); a tree passes the
        pending token's position plus each node's depth.
        attention_mask: bool [n, t + n] or [B, n, t + n] over the uncommitted tail t = length - committed and the
        new tokens (True = may attend); every committed position is always visible. None = causal.
        extra_embeds: [B, E, H] input embeddings of E more positions after the tokens (n counts them too in the
        positions and the mask); prefix: per-layer keys and values that these E positions alone attend to.
        """
        if (position_ids is not None or attention_mask is not None) and not self.takes_positions:
            raise DraftVerifyError(
                f"the {self.role} ({type(self.model).__name__}) derives positions from its cache alone, so it cannot "
                "score a token tree; use a chain drafter, or a decoder-only model that takes position_ids"
            )
        if self.valid is not None:
            if position_ids is not None or attention_mask is not None or extra_embeds is not None:
                raise DraftVerifyError("a batch of several rows scores chains only (no token trees) for now")
            return self._forward_rows(tokens, new_valid, want_hidden)
        if extra_embeds is not None or prefix:
            if attention_mask is None or self.is_encoder_decoder:
                raise DraftVerifyError("extra embedded positions need a decoder-only model and an explicit attention mask")
            if self._compiled is not None:
                raise DraftVerifyError(
                    f"the compiled {self.role} scores token ids only; methods that append learned embeddings (bita) "
                    "run without --compile"
                )
        if self._compiled is None:
            return self._run(tokens, keep=tokens.shape[1] + (0 if extra_embeds is None else extra_embeds.shape[1]),
                             position_ids=position_ids, attention_mask=attention_mask, want_hidden=want_hidden,
                             extra_embeds=extra_embeds, prefix=prefix)
        return self._run_padded(tokens, position_ids, attention_mask, want_hidden)

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
        position_ids = torch.cat([position_ids.to(self.device).expand(batch, n),
                                  (last + 1 + torch.arange(pad, device=self.device)).expand(batch, pad)], dim=1)
        mask = attention_mask.to(self.device)
        mask = mask.expand(batch, n, tail + n) if mask.dim() == 2 else mask
        wide = torch.zeros(batch, width, tail + width, dtype=torch.bool, device=self.device)
        wide[:, :n, : tail + n] = mask
        wide[:, n:, tail + n :] = torch.eye(pad, dtype=torch.bool, device=self.device)  # padding sees only itself
        out = self._run(tokens, keep=width, position_ids=position_ids, attention_mask=wide, want_hidden=want_hidden,
                        model=model)
        if pad:
            keep_positions(self.cache, self.length - pad, self.length)
            self.length -= pad
        return TargetOutput(logits=out.logits[:, :n], hidden=None if out.hidden is None else out.hidden[:, :n])

    def commit(self, kept: int | torch.Tensor) -> None:
        """Keep part of the uncommitted tail and settle it.

        kept: an int k keeps the tail's first k positions (a chain's accepted prefix: a crop); a long tensor
        [B, k] or [k] of tail offsets keeps those positions in that order (a tree's accepted branch: a gather).
        """
        if self.valid is not None:
            if isinstance(kept, torch.Tensor):
                raise DraftVerifyError("a batch of several rows keeps chains only: use commit_rows(counts)")
            self.commit_rows(torch.full_like(self.row_length, kept))
            return
        tail = self.length - self.committed
        if isinstance(kept, torch.Tensor):
            count = kept.shape[-1]
            if count > tail:
                raise DraftVerifyError(f"cannot keep {count} positions of a {tail}-position tail")
            gather_positions(self.cache, self.committed, kept, self.length)
        else:
            count = kept
            if not 0 <= count <= tail:
                raise DraftVerifyError(f"cannot keep {count} positions of a {tail}-position tail")
            keep_positions(self.cache, self.committed + count, self.length)
        self.length = self.committed = self.committed + count

    def rollback(self, length: int) -> None:
        """One row: drop every cached position from `length` on, settled or not. A draft with its own tokenizer
        re-tokenizes the text at the boundary with new text, which can change tokens it had settled."""
        if self.valid is not None:
            raise DraftVerifyError("rollback is for one row; a batch keeps chains with commit_rows")
        keep_positions(self.cache, length, self.length)
        self.length = length
        self.committed = min(self.committed, length)

    # ---- batch mode: rows of different lengths in one cache ---------------------------------------------------
    # Layout between steps: every row's real positions sit in order, ending at the cache's last slot or before it
    # (left padding, as in Hugging Face's batched generation, plus gaps where a row accepted fewer drafts than
    # another); slot validity hides padding and gaps from every query, and positions are counted per row, so a gap
    # changes nothing. A step appends the same number of slots to every row; commit_rows keeps a different number
    # per row, and the cache is re-packed to the right (a copy of every layer) once gaps exceed max_gap_share.

    def _start_rows(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, want_hidden: bool) -> torch.Tensor:
        if self.is_encoder_decoder or not self.takes_positions:
            raise DraftVerifyError(
                f"batches of several rows need a decoder-only {self.role} that takes position_ids (Llama, Qwen2, "
                f"GPT-2, GPT-NeoX, ...); {type(self.model).__name__} runs one row at a time"
            )
        if self.capacity is not None:
            raise DraftVerifyError("batches of several rows run on a growing KV cache: drop --compile / capacity")
        batch, width = input_ids.shape
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids, dtype=torch.bool)
        attention_mask = attention_mask.to(device=self.device, dtype=torch.bool)
        if attention_mask.shape != input_ids.shape or not bool(attention_mask[:, -1].all()):
            raise DraftVerifyError("a batch's attention mask must match input_ids [B, L] and pad on the left "
                                   "(every row's last column is a real token)")
        self.valid = torch.zeros(batch, 0, dtype=torch.bool, device=self.device)
        self.row_length = torch.zeros(batch, dtype=torch.long, device=self.device)
        self.row_committed = self.row_length.clone()
        if width > 1:
            out = self._forward_rows(input_ids[:, :-1], attention_mask[:, :-1], want_hidden, keep=1, keep_hidden=width - 1)
            self.prefilled = out
            self.commit_rows(attention_mask[:, :-1].sum(dim=1))
        return input_ids

    def _forward_rows(self, tokens: torch.Tensor, new_valid: torch.Tensor | None, want_hidden: bool,
                      keep: int | None = None, keep_hidden: int | None = None) -> TargetOutput:
        batch, n = tokens.shape
        if new_valid is None:
            new_valid = torch.ones(batch, n, dtype=torch.bool, device=self.device)
        new_valid = new_valid.to(self.device)
        steps = new_valid.long().cumsum(dim=1)  # [B, n]: real tokens up to and including each new slot
        position_ids = (self.row_length[:, None] + steps - 1).clamp_min(0)
        keys = torch.cat([self.valid, new_valid], dim=1)  # [B, length + n]
        causal = torch.ones(n, self.length + n, dtype=torch.bool, device=self.device).tril(diagonal=self.length)
        visible = causal[None] & keys[:, None, :]
        diagonal = torch.arange(n, device=self.device)
        visible[:, diagonal, self.length + diagonal] = True  # padding sees itself (an all-hidden row would be NaN)
        blocked = torch.tensor(torch.finfo(self.dtype).min, dtype=self.dtype, device=self.device)
        mask = torch.where(visible, torch.zeros((), dtype=self.dtype, device=self.device), blocked)[:, None]
        out = self._run(tokens, keep=n if keep is None else keep, position_ids=position_ids,
                        additive_mask=mask, want_hidden=want_hidden, keep_hidden=keep_hidden)
        self.valid = keys
        self.row_length = self.row_length + new_valid.sum(dim=1)
        return out

    def commit_rows(self, counts: torch.Tensor) -> None:
        """Batch mode: row b keeps the first counts[b] real positions of its uncommitted tail; then every row's
        positions are packed to the right again and the tail is settled."""
        self.truncate_rows(self.row_committed + counts.to(self.device))

    def truncate_rows(self, upto: torch.Tensor) -> None:
        """Batch mode: row b keeps its first upto[b] real positions (upto >= what it has committed) and drops the
        rest of its tail; the tail is settled (see _pack for the layout)."""
        upto = upto.to(self.device)
        if bool((upto < self.row_committed).any()) or bool((upto > self.row_length).any()):
            raise DraftVerifyError("cannot keep fewer positions than a row committed, or more than it holds")
        rank = self.valid.long().cumsum(dim=1)  # real positions up to and including each slot
        keep = self.valid & (rank <= upto[:, None])
        self._pack(keep)
        self.row_length = upto.clone()
        self.row_committed = upto.clone()

    def drop_rows(self, keep_rows: torch.Tensor) -> None:
        """Batch mode: keep only the rows where keep_rows [B] (bool) is True (finished rows leave the batch)."""
        index = keep_rows.to(self.device).nonzero().flatten()
        for layer in self_attention_layers(self.cache):
            layer.keys = layer.keys.index_select(0, index)
            layer.values = layer.values.index_select(0, index)
        self.valid = self.valid.index_select(0, index)
        self.row_length = self.row_length.index_select(0, index)
        self.row_committed = self.row_committed.index_select(0, index)
        if self.length > self.committed:
            raise DraftVerifyError("drop rows between steps only (the tail is not committed)")
        self._pack(self.valid)

    def join_rows(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> None:
        """Batch mode, between steps: prefill new left-padded rows [b, L] and append them to the batch (continuous
        batching). Their cache is left-padded to the batch's width (or the batch's to theirs) and concatenated."""
        if self.length > self.committed:
            raise DraftVerifyError("rows join between steps only (the tail is not committed)")
        old = (self.cache, self.valid, self.row_length, self.row_committed, self.length)
        self.cache = new_cache(False, self.config, None)
        self.length = self.committed = 0
        self._start_rows(input_ids, attention_mask, want_hidden=False)
        new_layers = self_attention_layers(self.cache) if self.length else []
        new_valid, new_len, new_committed, new_width = self.valid, self.row_length, self.row_committed, self.length
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
        self.row_length = torch.cat([row_length, new_len])
        self.row_committed = torch.cat([row_committed, new_committed])
        self.length = self.committed = total

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
        if bool((ends == end).all()) and start >= 0 and not bool(keep[:, :start].any()) \
                and bool((keep[:, start:end] == new_valid).all()):
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
            self.length = self.committed = end
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
        self.length = self.committed = width

    def _mask(self, attention_mask: torch.Tensor, batch: int, n: int, extra: int = 0, prefix: int = 0) -> torch.Tensor:
        """bool [(B,) n, t + n] over tail and new tokens -> additive [B, 1, n, prefix + keys] in the model's dtype,
        where keys is length + n (growing cache) or the capacity (preallocated cache; slots past the new tokens are
        hidden), and the `prefix` leading columns are visible to the last `extra` rows only."""
        tail = self.length - self.committed
        if attention_mask.shape[-2:] != (n, tail + n):
            raise DraftVerifyError(
                f"attention mask must cover {n} new tokens x {tail + n} tail + new positions, got {tuple(attention_mask.shape)}"
            )
        keys = self.window if self.window is not None else self.length + n  # a static cache attends to all slots
        visible = torch.zeros(batch, n, keys, dtype=torch.bool, device=self.device)
        visible[:, :, : self.committed] = True
        visible[:, :, self.committed : self.length + n] = attention_mask.to(self.device)
        if prefix:
            visible = prefix_columns(visible, torch.arange(n, device=self.device) >= n - extra, prefix)
        blocked = torch.tensor(torch.finfo(self.dtype).min, dtype=self.dtype, device=self.device)
        return torch.where(visible, torch.zeros((), dtype=self.dtype, device=self.device), blocked)[:, None]

    def _run(self, tokens, keep, position_ids=None, attention_mask=None, want_hidden=False, model=None,
             additive_mask=None, extra_embeds=None, prefix=None, keep_hidden=None) -> TargetOutput:
        """Append tokens [B, n] (and extra_embeds [B, E, H]); logits at the last `keep` positions, hidden states at
        the last `keep_hidden` (default keep) when want_hidden."""
        batch, n = tokens.shape
        keep_hidden = keep if keep_hidden is None else keep_hidden
        extra = 0 if extra_embeds is None else extra_embeds.shape[1]
        n += extra
        if self.window is not None and self.length + n > self.window:
            raise DraftVerifyError(
                f"the {self.role}'s preallocated cache holds {self.window} positions; {self.length + n} needed"
            )
        model = model if model is not None else self.model
        kwargs = {"past_key_values": self.cache, "use_cache": True, "output_hidden_states": want_hidden}
        if self._keeps_logits:
            kwargs["logits_to_keep"] = keep
        if self.takes_positions:
            if position_ids is None:
                position_ids = torch.arange(self.length, self.length + n, device=self.device)[None]
            kwargs["position_ids"] = position_ids.to(self.device).expand(batch, n)
        if attention_mask is not None:
            kwargs["attention_mask"] = self._mask(attention_mask, batch, n, extra, prefix_length(prefix))
        if additive_mask is not None:
            kwargs["attention_mask"] = additive_mask
        # the compiled graph has its own kernels; eager CPU float32 scores few rows in the W @ x.T layout
        with few_row_linears(self.device, self.dtype, rows=batch * n, on=model is self.model):
            if self.is_encoder_decoder:
                out = model(
                    encoder_outputs=self.encoder_outputs,
                    attention_mask=self.source_mask,
                    decoder_input_ids=tokens,
                    **kwargs,
                )
                hidden = out.decoder_hidden_states[-1][:, -keep_hidden:] if want_hidden else None
            elif extra_embeds is not None or prefix:
                embeds = self.model.get_input_embeddings()(tokens)  # [B, n - E, H]
                if extra_embeds is not None:
                    embeds = torch.cat([embeds, extra_embeds.to(embeds.dtype)], dim=1)  # [B, n, H]
                with attend_prefix(self.cache, prefix):
                    out = model(inputs_embeds=embeds, **kwargs)
                hidden = out.hidden_states[-1][:, -keep_hidden:] if want_hidden else None
            else:
                out = model(input_ids=tokens, **kwargs)
                hidden = out.hidden_states[-1][:, -keep_hidden:] if want_hidden else None
        self.cache = out.past_key_values
        self.length += n
        return TargetOutput(logits=out.logits[:, -keep:], hidden=hidden)  # [B, keep, V], [B, keep_hidden, H]


def cached_model(model, role: str, compile: bool = False):
    """A CachedLM as load() and the CLI build it: with compile, preallocated to the model's context length and
    compiled per width bucket; otherwise a growing cache. A CachedLM, or any other backend (backends/base.py),
    given in is used as it is (shared caches)."""
    if isinstance(model, CachedLM) or is_backend(model):
        return model
    capacity = (context_limit(model.config) or DEFAULT_CAPACITY) if compile else None
    return CachedLM(model, role=role, capacity=capacity, compile=compile)

"""A Hugging Face language model together with its KV cache: prefill once, score new tokens, keep what was accepted.

Serves the target and every drafter that runs a model, for decoder-only LMs and encoder-decoder models
(whose encoder runs once per generation and whose decoder is what we cache and roll back).

Positions are counted here, never read back from the cache object (a preallocated cache reports its capacity,
and a tree's positions are not its cache slots): `length` is how many positions the cache holds, `committed`
how many of those are settled. `forward` appends an uncommitted tail; `commit` keeps part of it and settles.

With `capacity` the cache is preallocated (HF StaticCache) and `commit` only moves its write position or copies a
tree branch down. Three modules, one class: this one holds the model, the plain layout (one row) and the forward;
rows.py the rows layout (batches), compiled_widths.py the compiled graphs (width buckets, windows, recompile
limits); the edits to Hugging Face cache internals live in cache.py and prefix.py.
"""

from __future__ import annotations

import inspect

import torch
from transformers import PreTrainedModel

from ...errors import DraftVerifyError
from ...types import PrefixKV, TargetOutput
from ..base import LMBackend, TargetModules, is_backend, kept_positions
from .cache import cache_argument, gather_positions, keep_positions, new_cache, returned_cache
from .compiled_widths import WIDTH_BUCKETS, CompiledWidths, compile_forward, window_for
from .few_row_linear import few_row_linears
from .prefix import attend_prefix, prefix_columns, prefix_length
from .rows import RowsLayout
from .shallow_view import shallow_view


def context_limit(config) -> int | None:
    """Maximum decoder positions the model can attend to, or None for relative-position models (T5)."""
    for attr in ("max_position_embeddings", "n_positions", "max_target_positions"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


DEFAULT_CAPACITY = 4096  # preallocated positions for models whose config states no context length (T5-style)


class CachedLM(RowsLayout, CompiledWidths):
    """One model, one cache. Invariant between steps: the cache holds every committed token but the last.

    The Hugging Face implementation of the backend protocol (backends/base.py: LMBackend, and ModuleBackend's
    module calls)."""

    name = "hf"
    supports_rows = True  # decoder-only models that take position_ids (checked in start)
    exposes_hidden = True
    has_modules = True
    computes_in_torch = True

    def __init__(
        self, model: PreTrainedModel, role: str = "target", capacity: int | None = None, compile: bool = False
    ):
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
        self._cache_arg = cache_argument(model)
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
        self.prompt_logits: list[torch.Tensor | None] | None = None  # per row, kept by start / join_rows when asked
        # batch mode (start() with several rows or a padding mask): which cache slots hold a real token [B, length],
        # and how many real positions each row holds [B] (its next position id); None for one unpadded row
        self.valid: torch.Tensor | None = None
        self._row_length: torch.Tensor | None = None  # read it as row_length (which also answers for one row)
        self.row_committed: torch.Tensor | None = None
        self._chain_end = 0  # rows layout: slots up to the last chain forward or commit (a tree's slots come after)
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

    def start(
        self,
        input_ids: torch.Tensor,
        want_hidden: bool = False,
        attention_mask: torch.Tensor | None = None,
        prompt_logits: bool = False,
    ) -> torch.Tensor:
        """Reset the cache and prefill. input_ids: [B, L] (the source for encoder-decoder models).

        Returns the committed decoder-side tokens [B, L0]: the prompt for decoder-only models,
        the decoder start token for encoder-decoder models. All but the last are now cached.
        `prefilled` then holds the logits at the last prefilled position [B, 1, V] and, when want_hidden, the
        hidden states at every prefilled position [B, L-1, H] (left padding included in a batch), or is None when
        nothing was prefilled (encoder-decoder, or a one-token prompt): drafters that read hidden states draft the
        first step from it (the blockwise heads from the last state, the NAT drafter from all of them).
        prompt_logits: also keep the logits at every prefilled position, for take_prompt_logits (decoder-only).
        """
        self.cache = new_cache(self.is_encoder_decoder, self.config, self.window)
        self.length = self.committed = self._chain_end = 0
        self.prefilled = None
        self.prompt_logits = None
        self.valid = self._row_length = self.row_committed = None
        if input_ids.shape[0] > 1 or attention_mask is not None:
            return self._start_rows(input_ids, attention_mask, want_hidden, prompt_logits)
        if self.is_encoder_decoder:
            start_id = getattr(self.config, "decoder_start_token_id", None)
            if start_id is None:
                raise DraftVerifyError(
                    f"the {self.role} is encoder-decoder but its config has no decoder_start_token_id"
                )
            self.source_mask = torch.ones_like(input_ids)
            self.encoder_outputs = self.model.get_encoder()(input_ids=input_ids, attention_mask=self.source_mask)
            return torch.full((input_ids.shape[0], 1), start_id, dtype=torch.long, device=input_ids.device)
        if prompt_logits:
            self.prompt_logits = [torch.empty(0, self.vocab_size, device=self.device)]  # a one-token prompt's
        if input_ids.shape[1] > 1:
            prefilled = input_ids.shape[1] - 1
            out = self._run(
                input_ids[:, :-1],
                keep=prefilled if prompt_logits else 1,
                want_hidden=want_hidden,
                keep_hidden=prefilled,
            )
            self.prefilled = TargetOutput(logits=out.logits[:, -1:], hidden=out.hidden)
            if prompt_logits:
                self.prompt_logits = [out.logits[0]]
            self.commit(prefilled)
        return input_ids

    def take_prompt_logits(self) -> list[torch.Tensor | None]:
        """The prefill's logits that start / join_rows kept (prompt_logits=True), once, per row [B]: logits
        [P, V] at the row's prompt positions but the last (position p scores prompt token p + 1), None for a row
        whose were not kept."""
        kept, self.prompt_logits = self.prompt_logits, None
        rows = 1 if self.valid is None else self.valid.shape[0]
        return kept if kept is not None else [None] * rows

    def forward(
        self,
        tokens: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        want_hidden: bool = False,
        new_valid: torch.Tensor | None = None,
        logits_to_keep: int = 0,
    ) -> TargetOutput:
        """Append tokens [B, n] to the cache's tail; return their next-token logits [B, n, V] (and hidden [B, n, H]).

        new_valid (batch mode only): bool [B, n], False for padding among the new tokens (a row that has fewer
        tokens to feed is left-padded); padding takes no position and no later token ever sees it.

        position_ids: [B or 1, n] absolute positions (default: length, length + 1, ...); a tree passes the
        pending token's position plus each node's depth.
        attention_mask: bool [n, t + n] or [B, n, t + n] over the uncommitted tail t = length - committed and the
        new tokens (True = may attend); every committed position is always visible. None = causal.
        logits_to_keep k > 0: the logits of the last min(k, n) positions alone [B, min(k, n), V] (the output
        layer runs on those only where the model takes Hugging Face's argument of that name); hidden stays [B, n, H].
        """
        self._check_positions(position_ids, attention_mask)
        n = tokens.shape[1]
        keep = kept_positions(logits_to_keep, n)
        if self.valid is not None:
            if attention_mask is not None:
                out = self._forward_tree_rows(tokens, position_ids, attention_mask, want_hidden)
                return TargetOutput(logits=out.logits[:, n - keep :], hidden=out.hidden)
            return self._forward_rows(tokens, new_valid, want_hidden, keep=keep, keep_hidden=n)
        if self._compiled is None:
            return self._run(
                tokens,
                keep=keep,
                position_ids=position_ids,
                attention_mask=attention_mask,
                want_hidden=want_hidden,
                keep_hidden=n,
            )
        out = self._run_padded(tokens, position_ids, attention_mask, want_hidden)
        return TargetOutput(logits=out.logits[:, n - keep :], hidden=out.hidden)

    def forward_extra(
        self,
        tokens: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        extra_embeds: torch.Tensor,
        prefix: PrefixKV | None = None,
        want_hidden: bool = False,
    ) -> TargetOutput:
        """forward() of tokens [B, n] followed by E embedded positions extra_embeds [B, E, H] (not vocabulary
        tokens), which alone attend to `prefix` (per-layer keys and values of a deep prompt); outputs [B, n + E,
        ...]. position_ids [B or 1, n + E] and attention_mask bool [n + E, t + n + E] count the E positions too.
        Hugging Face only: the target wrapper of a method that appends them calls it (drafters/extra_positions.py).
        """
        self._check_positions(position_ids, attention_mask)
        if self.is_encoder_decoder:
            raise DraftVerifyError("extra embedded positions need a decoder-only model")
        if self._compiled is not None:
            raise DraftVerifyError(
                f"the compiled {self.role} scores token ids only; methods that append learned embeddings (bita) "
                "run without --compile"
            )
        if self.valid is not None:
            return self._forward_tree_rows(tokens, position_ids, attention_mask, want_hidden, extra_embeds, prefix)
        return self._run(
            tokens,
            keep=tokens.shape[1] + extra_embeds.shape[1],
            position_ids=position_ids,
            attention_mask=attention_mask,
            want_hidden=want_hidden,
            extra_embeds=extra_embeds,
            prefix=prefix,
        )

    def _check_positions(self, position_ids: torch.Tensor | None, attention_mask: torch.Tensor | None) -> None:
        if (position_ids is not None or attention_mask is not None) and not self.takes_positions:
            raise DraftVerifyError(
                f"the {self.role} ({type(self.model).__name__}) derives positions from its cache alone, so it cannot "
                "score a token tree; use a chain drafter, or a decoder-only model that takes position_ids"
            )

    def commit(self, kept: int | torch.Tensor) -> None:
        """Keep part of the uncommitted tail and settle it.

        kept: an int k keeps the tail's first k positions (a chain's accepted prefix: a crop); a long tensor
        [B, k] or [k] of tail offsets keeps those positions in that order (a tree's accepted branch: a gather); in
        the rows layout each row keeps its own offsets, in increasing order, -1 padded.
        """
        if self.valid is not None:
            if isinstance(kept, torch.Tensor):
                self._commit_branches(kept)
            else:
                self.commit_rows(torch.full_like(self._row_length, kept))
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

    @property
    def compiled(self) -> bool:
        """Whether its forward runs compiled graphs (compile=True)."""
        return self._compiled is not None

    def modules(self) -> TargetModules:
        return TargetModules.of(self.model)

    def first_layers(self, count: int, role: str, compile: bool = False) -> LMBackend:
        return cached_model(shallow_view(self.model, count), role, compile)

    def module(self) -> PreTrainedModel:
        return self.model

    def encoder_states(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.encoder_outputs is None:
            raise DraftVerifyError(f"the {self.role} has no encoder states: it is decoder-only, or start() has not run")
        return self.encoder_outputs.last_hidden_state, self.source_mask  # [B, S, H], [B, S]

    def rollback(self, length: int) -> None:
        """One row: drop every cached position from `length` on, settled or not. A draft with its own tokenizer
        re-tokenizes the text at the boundary with new text, which can change tokens it had settled."""
        if self.valid is not None:
            raise DraftVerifyError("rollback is for one row; a batch keeps chains with commit_rows")
        keep_positions(self.cache, length, self.length)
        self.length = length
        self.committed = min(self.committed, length)

    def _mask(self, attention_mask: torch.Tensor, batch: int, n: int, extra: int = 0, prefix: int = 0) -> torch.Tensor:
        """bool [(B,) n, t + n] over tail and new tokens -> additive [B, 1, n, prefix + keys] in the model's dtype,
        where keys is length + n (growing cache) or the capacity (preallocated cache; slots past the new tokens are
        hidden), and the `prefix` leading columns are visible to the last `extra` rows only."""
        tail = self.length - self.committed
        if attention_mask.shape[-2:] != (n, tail + n):
            raise DraftVerifyError(
                f"attention mask must cover {n} new tokens x {tail + n} tail + new positions, got "
                f"{tuple(attention_mask.shape)}"
            )
        keys = self.window if self.window is not None else self.length + n  # a static cache attends to all slots
        visible = torch.zeros(batch, n, keys, dtype=torch.bool, device=self.device)
        visible[:, :, : self.committed] = True
        visible[:, :, self.committed : self.length + n] = attention_mask.to(self.device)
        if prefix:
            visible = prefix_columns(visible, torch.arange(n, device=self.device) >= n - extra, prefix)
        blocked = torch.tensor(torch.finfo(self.dtype).min, dtype=self.dtype, device=self.device)
        return torch.where(visible, torch.zeros((), dtype=self.dtype, device=self.device), blocked)[:, None]

    def _run(
        self,
        tokens,
        keep,
        position_ids=None,
        attention_mask=None,
        want_hidden=False,
        model=None,
        additive_mask=None,
        extra_embeds=None,
        prefix=None,
        keep_hidden=None,
    ) -> TargetOutput:
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
        kwargs = {self._cache_arg: self.cache, "use_cache": True, "output_hidden_states": want_hidden}
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
        self.cache = returned_cache(out)
        self.length += n
        return TargetOutput(logits=out.logits[:, -keep:], hidden=hidden)  # [B, keep, V], [B, keep_hidden, H]


def cached_model(model, role: str, compile: bool = False):
    """A CachedLM as load() and the CLI build it: with compile, preallocated to the model's context length and
    compiled per width bucket; otherwise a growing cache. A CachedLM, or any other backend (backends/base.py),
    given in is used as it is (shared caches)."""
    if is_backend(model):
        return model
    capacity = (context_limit(model.config) or DEFAULT_CAPACITY) if compile else None
    return CachedLM(model, role=role, capacity=capacity, compile=compile)

"""A Hugging Face language model together with its KV cache: prefill once, score new tokens, roll back.

Serves the target and every drafter that runs a model, for decoder-only LMs and encoder-decoder models
(whose encoder runs once per generation and whose decoder is what we cache and roll back).
"""
from __future__ import annotations

import inspect

import torch
from transformers import PreTrainedModel

from .cache import cache_length, crop_cache, new_cache
from .errors import DraftVerifyError


def context_limit(config) -> int | None:
    """Maximum decoder positions the model can attend to, or None for relative-position models (T5)."""
    for attr in ("max_position_embeddings", "n_positions", "max_target_positions"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


class CachedLM:
    """One model, one cache. Invariant between calls: the cache holds every committed token but the last."""

    def __init__(self, model: PreTrainedModel, role: str = "target"):
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
        self._keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.cache = None
        self.encoder_outputs = None
        self.source_mask = None

    @property
    def cached_length(self) -> int:
        return cache_length(self.cache) if self.cache is not None else 0

    def check_fits(self, decoder_positions: int) -> None:
        if self.max_positions is not None and decoder_positions > self.max_positions:
            raise DraftVerifyError(
                f"the {self.role} model attends to at most {self.max_positions} positions, but this request needs "
                f"{decoder_positions} (prompt + max_new_tokens); shorten the prompt or lower max_new_tokens"
            )

    def start(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Reset the cache and prefill. input_ids: [B, L] (the source for encoder-decoder models).

        Returns the committed decoder-side tokens [B, L0]: the prompt for decoder-only models,
        the decoder start token for encoder-decoder models. All but the last are now cached.
        """
        self.cache = new_cache(self.is_encoder_decoder)
        if self.is_encoder_decoder:
            start_id = getattr(self.config, "decoder_start_token_id", None)
            if start_id is None:
                raise DraftVerifyError(f"the {self.role} is encoder-decoder but its config has no decoder_start_token_id")
            self.source_mask = torch.ones_like(input_ids)
            self.encoder_outputs = self.model.get_encoder()(input_ids=input_ids, attention_mask=self.source_mask)
            return torch.full((input_ids.shape[0], 1), start_id, dtype=torch.long, device=input_ids.device)
        if input_ids.shape[1] > 1:
            self._run(input_ids[:, :-1], keep=1)
        return input_ids

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Append tokens [B, n] to the cache; return their next-token logits [B, n, V]."""
        return self._run(tokens, keep=tokens.shape[1])

    def crop(self, length: int) -> None:
        crop_cache(self.cache, length)

    def _run(self, tokens: torch.Tensor, keep: int) -> torch.Tensor:
        kwargs = {"past_key_values": self.cache, "use_cache": True}
        if self._keeps_logits:
            kwargs["logits_to_keep"] = keep
        if self.is_encoder_decoder:
            out = self.model(
                encoder_outputs=self.encoder_outputs,
                attention_mask=self.source_mask,
                decoder_input_ids=tokens,
                **kwargs,
            )
        else:
            out = self.model(input_ids=tokens, **kwargs)
        self.cache = out.past_key_values
        return out.logits[:, -keep:]  # [B, keep, V]

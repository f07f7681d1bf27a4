"""BiTA's bi-directional tuning parameters (Lin et al. 2024, "BiTA: Bi-Directional Tuning for Lossless Acceleration
in Large Language Models"): learned mask tokens and prompt tokens on a frozen target.

- Mask tokens: M input embeddings, one per look-ahead position. Placed after the last real token at positions
  +1..+M, mask token i predicts the token i + 1 after that real token (the real token itself predicts + 1).
- Prompt tokens, three variants of the paper's Table 3:
  * "none": mask tokens only;
  * "shallow": P input embeddings run through the frozen target as a prefix at positions 0..P-1; their per-layer
    keys and values (computed once per generation) are what the mask tokens attend to;
  * "deep" (the paper's choice, P-tuning v2): the per-layer keys and values themselves are learned.
  Either way the prompt is seen by the mask tokens only (the paper's Figure 3), never by ordinary tokens.

Only these parameters are saved (fp16 safetensors + bita.json); the target is referenced by its LM head's
fingerprint, so an adapter cannot be used with a target it was not trained on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers.cache_utils import DynamicCache

from ..backends.hf.cache import cache_argument
from ..errors import DraftVerifyError
from ..types import PrefixKV
from .blockwise import lm_head_fingerprint
from .fingerprint import fingerprint_matches
from .weights_folder import SavedModule, WeightsFolder

ADAPTER_FORMAT = "draftverify-bita"
FOLDER = WeightsFolder("bita", ADAPTER_FORMAT, "BiTA adapter", "draftverify train bita")
PROMPT_KINDS = ("none", "shallow", "deep")
INIT_STD = 0.02  # the paper's initialisation: N(0, 0.02)


@dataclass(frozen=True)
class BitaConfig:
    num_masks: int  # M look-ahead positions
    num_prompts: int  # P prompt tokens (0 when prompt == "none")
    prompt: str  # "none" | "shallow" | "deep"
    hidden_size: int  # H of the target's input embeddings
    num_layers: int  # target layers (deep prompt: keys and values for each)
    kv_heads: int
    head_dim: int
    target_fingerprint: str

    def __post_init__(self) -> None:
        if self.prompt not in PROMPT_KINDS:
            raise DraftVerifyError(f"bita prompt must be one of {', '.join(PROMPT_KINDS)}, got {self.prompt!r}")
        for name in ("num_masks", "hidden_size", "num_layers", "kv_heads", "head_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise DraftVerifyError(f"bita config: {name} must be a positive integer, got {value!r}")
        if isinstance(self.num_prompts, bool) or not isinstance(self.num_prompts, int) or self.num_prompts < 0:
            raise DraftVerifyError(f"bita config: num_prompts must be an integer >= 0, got {self.num_prompts!r}")
        if (self.prompt == "none") != (self.num_prompts == 0):
            raise DraftVerifyError(
                "bita: give prompt tokens (num_prompts >= 1) exactly when the prompt is shallow or deep"
            )


def kv_layout(model: nn.Module) -> tuple[int, int, int]:
    """(layers, KV heads, head dim) of a decoder's cache, read from a one-token forward (any architecture)."""
    cache = DynamicCache()
    with torch.no_grad():
        model(
            input_ids=torch.zeros(1, 1, dtype=torch.long, device=model.device),
            **{cache_argument(model): cache},
            use_cache=True,
        )
    keys = cache.layers[0].keys  # [1, h, 1, d]
    return len(cache.layers), keys.shape[1], keys.shape[3]


class BitaAdapter(SavedModule):
    weights_folder = FOLDER
    config_class = BitaConfig

    def __init__(self, config: BitaConfig):
        super().__init__(config)
        c = config
        self.mask_embeds = nn.Parameter(torch.randn(c.num_masks, c.hidden_size) * INIT_STD)  # [M, H]
        if c.prompt == "deep":
            shape = (c.num_layers, c.kv_heads, c.num_prompts, c.head_dim)
            self.prefix_keys = nn.Parameter(torch.randn(shape) * INIT_STD)  # [L, h, P, d]
            self.prefix_values = nn.Parameter(torch.randn(shape) * INIT_STD)  # [L, h, P, d]
        elif c.prompt == "shallow":
            self.prompt_embeds = nn.Parameter(torch.randn(c.num_prompts, c.hidden_size) * INIT_STD)  # [P, H]

    @classmethod
    def for_target(
        cls, target: nn.Module, num_masks: int = 3, prompt: str = "deep", num_prompts: int = 16
    ) -> "BitaAdapter":
        layers, heads, dim = kv_layout(target)
        hidden = target.get_input_embeddings().weight.shape[1]
        config = BitaConfig(
            num_masks,
            0 if prompt == "none" else num_prompts,
            prompt,
            hidden,
            layers,
            heads,
            dim,
            lm_head_fingerprint(target.get_output_embeddings()),
        )
        return cls(config)

    def prefix(self, target: nn.Module) -> PrefixKV | None:
        """Per-layer (keys, values) [h, P, d] the mask tokens attend to (differentiable), or None (mask tokens only)."""
        if self.config.prompt == "deep":
            return tuple((self.prefix_keys[i], self.prefix_values[i]) for i in range(self.config.num_layers))
        if self.config.prompt == "shallow":
            cache = DynamicCache()
            embeds = self.prompt_embeds.to(target.dtype)[None]  # [1, P, H]
            positions = torch.arange(self.config.num_prompts, device=embeds.device)[None]
            target(inputs_embeds=embeds, position_ids=positions, **{cache_argument(target): cache}, use_cache=True)
            return tuple((layer.keys[0], layer.values[0]) for layer in cache.layers)
        return None

    def check_target(self, target: nn.Module) -> None:
        found = lm_head_fingerprint(target.get_output_embeddings())
        if not fingerprint_matches(self.config.target_fingerprint, target.get_output_embeddings().weight):
            raise DraftVerifyError(
                "the BiTA adapter was trained for another target (LM head fingerprint "
                f"{self.config.target_fingerprint}, this target's is {found}); train one for it with "
                "`draftverify train bita`"
            )

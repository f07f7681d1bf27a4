"""What LeanLM runs: a Llama-family model's weights as plain tensors, and its rotary cos / sin.

LeanLM (lean.py) replays a Hugging Face Llama, Mistral or Qwen2 forward in a handful of torch ops per layer, so
everything it needs is read out of the loaded model once here: the weights as detached tensors sharing the model's
storage (q/k/v and gate/up fused into one matrix each, the only copies: one linear instead of three or two), the
norms' epsilons, and cos / sin from the model's own rotary module, so every rope scaling HF implements matches.
`unsupported` says in one line why a model cannot run this way; callers then keep CachedLM.

The fused matrices are a snapshot: a draft model whose weights change after LeanLM is built (training) needs a
new LeanLM.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

# model_type -> the transformers class whose forward LeanLM replays (subclasses may change it: refused)
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
# rope types whose inv_freq depends on the positions of each call: cos / sin come from the module per forward
PER_CALL_ROPE = ("dynamic", "longrope")


def unsupported(model) -> str | None:
    """Why `model` cannot run on LeanLM (one phrase), or None when it can."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if getattr(config, "is_encoder_decoder", False):
        return "an encoder-decoder model"
    if model_type not in ARCHITECTURES or type(model).__name__ != ARCHITECTURES[model_type]:
        return f"{type(model).__name__} is not one of {', '.join(ARCHITECTURES.values())}"
    layer_types = getattr(config, "layer_types", None) or []
    window = getattr(config, "sliding_window", None) if model_type == "mistral" else None
    limit = getattr(config, "max_position_embeddings", None)
    if "sliding_attention" in layer_types or (window is not None and (limit is None or window < limit)):
        return "sliding-window attention"
    if not torch.is_floating_point(next(model.parameters())):
        return "quantized weights"
    body = model.model
    modules = [body.embed_tokens, body.norm, model.lm_head]
    for layer in body.layers:
        attn, mlp = layer.self_attn, layer.mlp
        modules += [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj]
    if any(type(m) not in (nn.Linear, nn.Embedding) and not type(m).__name__.endswith("RMSNorm") for m in modules):
        return "layers that are not plain Linear / Embedding / RMSNorm modules (quantized or adapted)"
    if model.training:
        return "a model in training mode"
    return None


def _w(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach()


def _linear(linear: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A linear's weight [out, in] and bias [out] (None without one), as LayerWeights holds them."""
    return linear.weight.detach(), _w(linear.bias)


def _norm(norm) -> tuple[torch.Tensor, float]:
    """An RMSNorm module's weight [H] and epsilon, as LayerWeights holds them."""
    return norm.weight.detach(), float(norm.variance_epsilon)


def _fused(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One [sum(out), in] weight (and bias, zeros where a part has none) for linears that read the same input."""
    weight = torch.cat([m.weight.detach() for m in linears])
    if all(m.bias is None for m in linears):
        return weight, None
    bias = torch.cat(
        [m.bias.detach() if m.bias is not None else m.weight.new_zeros(m.weight.shape[0]) for m in linears]
    )
    return weight, bias


@dataclass
class LayerWeights:
    """One decoder layer: norms [H], fused qkv [(Hq + 2 Hkv) d, H], o [H, Hq d], fused gate_up [2 I, H], down [H, I].
    Each norm is followed by its epsilon and each linear by its bias (None: none), so a layer is built from pairs
    (LeanWeights.from_model)."""

    norm_in: torch.Tensor
    eps_in: float
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    norm_post: torch.Tensor
    eps_post: float
    gate_up: torch.Tensor
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor
    down_bias: torch.Tensor | None
    act: object  # the MLP's activation: F.silu, or the module's own act_fn


@dataclass
class LeanWeights:
    embed: torch.Tensor  # [V, H]
    layers: list[LayerWeights]
    norm: torch.Tensor  # [H]
    eps: float
    head: torch.Tensor  # [V, H] (the embedding's storage when tied)
    heads: int
    kv_heads: int
    head_dim: int
    scale: float

    @classmethod
    def from_model(cls, model) -> "LeanWeights":
        body = model.model
        layers = []
        for layer in body.layers:
            attn, mlp = layer.self_attn, layer.mlp
            act = F.silu if getattr(model.config, "hidden_act", None) == "silu" else mlp.act_fn
            layers.append(
                LayerWeights(
                    *_norm(layer.input_layernorm),  # norm_in, eps_in
                    *_fused([attn.q_proj, attn.k_proj, attn.v_proj]),  # qkv, qkv_bias
                    *_linear(attn.o_proj),  # o, o_bias
                    *_norm(layer.post_attention_layernorm),  # norm_post, eps_post
                    *_fused([mlp.gate_proj, mlp.up_proj]),  # gate_up, gate_up_bias
                    *_linear(mlp.down_proj),  # down, down_bias
                    act,
                )
            )
        first = body.layers[0].self_attn
        head_dim = int(first.head_dim)
        heads = first.q_proj.weight.shape[0] // head_dim
        kv_heads = first.k_proj.weight.shape[0] // head_dim
        return cls(
            embed=_w(body.embed_tokens.weight),
            layers=layers,
            norm=_w(body.norm.weight),
            eps=float(body.norm.variance_epsilon),
            head=_w(model.lm_head.weight),
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            scale=float(first.scaling),
        )


class Rope:
    """cos / sin [P, d] for positions, from the model's own rotary module (HF folds any attention scaling into
    them). Static rope types are tabulated once per capacity; dynamic ones ask the module per forward, with that
    forward's positions, as HF does. `sin` carries rotate_half's sign (-1 on the first half), so applying rope is
    x * cos + x.roll(d / 2) * sin."""

    def __init__(self, model, dtype: torch.dtype, device: torch.device):
        self.module = model.model.rotary_emb
        self.per_call = getattr(self.module, "rope_type", "default") in PER_CALL_ROPE
        self.dtype, self.device = dtype, device
        self.cos = self.sin = None  # [P, d] tables (static rope types)

    def _ask(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [n] -> the module's cos, sin [n, d] with rotate_half's sign folded into sin."""
        probe = torch.empty(0, dtype=self.dtype, device=self.device)
        cos, sin = self.module(probe, positions.to(self.device)[None])  # [1, n, d] each
        half = sin.shape[-1] // 2
        sign = torch.ones(sin.shape[-1], dtype=sin.dtype, device=sin.device)
        sign[:half] = -1
        return cos[0], sin[0] * sign

    def reserve(self, capacity: int) -> None:
        """Tabulate positions [0, capacity) (static rope types)."""
        if not self.per_call and (self.cos is None or self.cos.shape[0] < capacity):
            with torch.inference_mode(False):
                self.cos, self.sin = self._ask(torch.arange(capacity, device=self.device))

    def at(self, start: int, n: int, positions: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [n, d] at positions [n] (None: the chain start, start + 1, ...)."""
        if self.per_call:
            if positions is None:
                positions = torch.arange(start, start + n, device=self.device)
            return self._ask(positions)
        if positions is None:
            return self.cos[start : start + n], self.sin[start : start + n]
        positions = positions.to(self.device)
        return self.cos.index_select(0, positions), self.sin.index_select(0, positions)

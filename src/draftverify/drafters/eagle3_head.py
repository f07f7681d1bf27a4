"""The EAGLE-3 head (Li et al. 2025): one Llama decoder layer that drafts from the target's own features.

The target's inputs to three of its layers (low, middle, high: `aux_layers`) are concatenated per position and
projected by fc (3H -> H) to g. At head position j the layer reads the pair (g_j, embedding of token j + 1): both
RMS-normed and concatenated (2H) into attention, with g_j as the residual; its output before the final norm (the
"prenorm" state) is read out through the final norm and an LM head as the next-next token's logits, and stands in
for g at position j + 1 when the head drafts on from its own guess.

The parameter names are those of EAGLE-3 checkpoints (fc, midlayer.*, norm, lm_head, d2t), so the folder this
module saves is the checkpoint that llama.cpp's converter and vLLM's `eagle3` loader read. With draft_vocab_size
equal to the target's vocabulary the head has no LM head of its own: it reads out through the target's, and its
files hold only its own weights.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import DraftVerifyError
from .blockwise import lm_head_fingerprint
from .fingerprint import fingerprint_matches
from .weights_folder import fill, read_json, save_fp16

EAGLE3_FORMAT = "draftverify-eagle3"
MADE_BY = "draftverify train eagle3"


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's choice (and llama.cpp's and vLLM's default): the inputs of layers 2, L/2 and L-3."""
    return (min(2, num_layers - 1), num_layers // 2, max(num_layers - 3, 0))


@dataclass(frozen=True)
class Eagle3Config:
    hidden_size: int  # H, the target's
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int  # the head's MLP
    vocab_size: int  # the target's V
    aux_layers: tuple[int, int, int]  # target layers whose inputs are fused
    target_num_layers: int
    target_fingerprint: str  # lm_head_fingerprint of the target
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    training: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise DraftVerifyError(f"EAGLE-3 config: {name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise DraftVerifyError("EAGLE-3 config: num_attention_heads must be a multiple of num_key_value_heads")
        layers = tuple(self.aux_layers)
        if len(layers) != 3 or not all(0 <= i < self.target_num_layers for i in layers):
            raise DraftVerifyError(
                f"EAGLE-3 fuses the inputs of 3 target layers in 0..{self.target_num_layers - 1}, got {layers}"
            )
        object.__setattr__(self, "aux_layers", layers)

    @classmethod
    def for_target(cls, config, lm_head: nn.Module, intermediate_size: int | None = None, aux_layers=None):
        """Sized like one of the target's layers (config: its transformers config); the head's rotary embedding
        is its own, with the target's base where the target has a plain one."""
        hidden, heads = config.hidden_size, config.num_attention_heads
        rope = getattr(config, "rope_parameters", None) or {}
        return cls(
            hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or hidden // heads,
            intermediate_size=intermediate_size or getattr(config, "intermediate_size", None) or 4 * hidden,
            vocab_size=lm_head.weight.shape[0],
            aux_layers=tuple(aux_layers or default_aux_layers(config.num_hidden_layers)),
            target_num_layers=config.num_hidden_layers,
            target_fingerprint=lm_head_fingerprint(lm_head),
            rms_norm_eps=float(getattr(config, "rms_norm_eps", 1e-5)),
            rope_theta=float(rope.get("rope_theta", 10000.0)) if rope.get("rope_type", "default") == "default" else 1e4,
            max_position_embeddings=int(getattr(config, "max_position_embeddings", None) or 2048),
        )

    def checkpoint_config(self) -> dict:
        """config.json in the EAGLE-3 checkpoint layout (the fields llama.cpp's converter and vLLM read), with this
        project's own fields under "draftverify"."""
        own = asdict(self)
        training = own.pop("training")
        return {
            "architectures": ["LlamaForCausalLMEagle3"],
            "model_type": "llama",
            "hidden_act": "silu",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "num_hidden_layers": 1,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.vocab_size,
            "target_hidden_size": self.hidden_size,
            "eagle_aux_hidden_state_layer_ids": list(self.aux_layers),
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(self.aux_layers), "use_aux_hidden_state": True},
            "tie_word_embeddings": False,
            "torch_dtype": "float16",
            "draftverify": {"format": EAGLE3_FORMAT, "version": 1, **own, "training": training},
        }


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)).to(dtype) * self.weight


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Llama's rotary embedding (rotate-half layout, as Hugging Face stores q and k) of x [B, heads, n, d] at
    positions [B or 1, n]."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))  # [d/2]
    angles = positions.to(torch.float32)[..., None] * inv_freq  # [B, n, d/2]
    angles = torch.cat([angles, angles], dim=-1)[:, None]  # [B, 1, n, d]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    half = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], dim=-1)
    return x * cos + half * sin


class Attention(nn.Module):
    def __init__(self, c: Eagle3Config):
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(2 * c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)

    def qkv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, n, 2H] at positions [B or 1, n] -> q [B, heads, n, d], k and v [B, heads, n, d] (KV heads
        repeated to the query heads)."""
        b, n, _ = x.shape
        c = self.c
        q = self.q_proj(x).view(b, n, c.num_attention_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, n, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, n, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        q, k = rope(q, positions, c.rope_theta), rope(k, positions, c.rope_theta)
        groups = c.num_attention_heads // c.num_key_value_heads
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        return q, k, v

    def out(self, attended: torch.Tensor) -> torch.Tensor:
        """attended [B, heads, n, d] -> [B, n, H]."""
        b, _, n, _ = attended.shape
        return self.o_proj(attended.transpose(1, 2).reshape(b, n, -1))


class MLP(nn.Module):
    def __init__(self, c: Eagle3Config):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    def __init__(self, c: Eagle3Config):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)  # on the token embeddings
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)  # on g
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)

    def attention_input(self, embeds: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """[B, n, H] twice -> [B, n, 2H]."""
        return torch.cat([self.input_layernorm(embeds), self.hidden_norm(g)], dim=-1)

    def finish(self, attended: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """The attention's output [B, heads, n, d] and the residual g [B, n, H] -> prenorm state [B, n, H]."""
        h = self.self_attn.out(attended) + g
        return h + self.mlp(self.post_attention_layernorm(h))


class HeadCache:
    """The head's keys and values [B, heads, P, d], one column per pair fed, cut back to the real prefix after each
    draft (a list of growing tensors would cost more than the cat at these sizes). In a batch of rows a column may
    hold padding for some rows: the drafter keeps which columns are each row's real pairs."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v

    def truncate(self, length: int) -> None:
        if self.k is not None and self.k.shape[2] > length:
            self.k, self.v = self.k[:, :, :length], self.v[:, :, :length]  # type: ignore[index]

    def select(self, rows: torch.Tensor) -> None:
        if self.k is not None:
            self.k, self.v = self.k[rows], self.v[rows]  # type: ignore[index]

    def join(self, rows: int) -> None:
        """`rows` new rows at the end of the batch, holding nothing (zeros: their owner masks them out)."""
        if self.k is not None:
            self.k = torch.cat([self.k, self.k.new_zeros((rows, *self.k.shape[1:]))])
            self.v = torch.cat([self.v, self.v.new_zeros((rows, *self.v.shape[1:]))])  # type: ignore[union-attr]


class Eagle3Head(nn.Module):
    """fc, the mid layer and the final norm (the LM head and token embedding are the target's, passed in)."""

    def __init__(self, config: Eagle3Config):
        super().__init__()
        self.config = config
        self.fc = nn.Linear(3 * config.hidden_size, config.hidden_size, bias=False)
        self.midlayer = MidLayer(config)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def step(
        self,
        cache: HeadCache,
        embeds: torch.Tensor,
        g: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Inference: pairs (g [B, n, H], token embeddings [B, n, H]) at positions [B or 1, n] after the cache's,
        causal among themselves unless mask (bool [n, cache + n] or per row [B, n, cache + n]: what each new pair
        sees, e.g. its tree ancestors, a row's real pairs) says otherwise; their keys and values join the cache.
        Returns the prenorm states [B, n, H]."""
        layer = self.midlayer
        q, k, v = layer.self_attn.qkv(layer.attention_input(embeds, g), positions)
        past = cache.length
        keys, values = cache.append(k, v)
        n = q.shape[2]
        if mask is None and n > 1:  # the new positions see the cache and each other causally
            mask = torch.ones(n, past + n, dtype=torch.bool, device=q.device).tril(past)
        elif mask is not None and mask.dim() == 3:
            mask = mask[:, None]  # [B, 1, n, cache + n]: every attention head alike
        attended = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return layer.finish(attended, g)

    def logits(self, prenorm: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """prenorm [..., H] -> logits [..., V] through the target's LM head."""
        return lm_head(self.norm(prenorm).to(lm_head.weight.dtype))

    def check_target(self, lm_head: nn.Module, num_layers: int, fingerprint: bool = True) -> None:
        """Refuse a head trained for another target: its features and LM head would mean something else.
        fingerprint=False checks the shapes only (a quantized copy of the target has other values)."""
        c = self.config
        vocab, hidden = lm_head.weight.shape
        if (hidden, vocab, num_layers) != (c.hidden_size, c.vocab_size, c.target_num_layers):
            raise DraftVerifyError(
                f"the EAGLE-3 head was trained for a target with hidden size {c.hidden_size}, {c.vocab_size} tokens "
                f"and {c.target_num_layers} layers, but this target has {hidden}, {vocab} and {num_layers}; train "
                f"one for it with `{MADE_BY}`"
            )
        if fingerprint and not fingerprint_matches(c.target_fingerprint, lm_head.weight):
            found = lm_head_fingerprint(lm_head)
            raise DraftVerifyError(
                f"the EAGLE-3 head was trained for another target (LM head fingerprint {c.target_fingerprint}, this "
                f"target's is {found}); train one for it with `{MADE_BY}`"
            )

    def save(self, folder: str | Path) -> Path:
        """folder/config.json + folder/model.safetensors (fp16), the EAGLE-3 checkpoint layout."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        save_fp16(self, folder / "model.safetensors", "pt")
        (folder / "config.json").write_text(json.dumps(self.config.checkpoint_config(), indent=1) + "\n")
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> "Eagle3Head":
        folder = Path(folder)
        config_path, weights_path = folder / "config.json", folder / "model.safetensors"
        if not config_path.is_file() or not weights_path.is_file():
            raise DraftVerifyError(
                f"no EAGLE-3 head in {folder}: expected config.json and model.safetensors (written by `{MADE_BY}`)"
            )
        info = read_json(config_path)
        own = info.get("draftverify") if isinstance(info, dict) else None
        if not isinstance(own, dict) or own.get("format") != EAGLE3_FORMAT:
            raise DraftVerifyError(
                f"{config_path} is not an EAGLE-3 head written by draftverify (no 'draftverify' section with format "
                f"{EAGLE3_FORMAT!r}); train one with `{MADE_BY}`"
            )
        names = Eagle3Config.__dataclass_fields__
        try:
            config = Eagle3Config(**{k: v for k, v in own.items() if k in names})
        except TypeError as err:
            raise DraftVerifyError(f"{config_path}: {err}") from None
        return cast(Eagle3Head, fill(cls(config), weights_path))

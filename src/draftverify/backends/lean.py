"""LeanLM: a small Llama-family draft model's forward in plain torch ops over a preallocated KV buffer.

A small draft model's forward on the hf backend is mostly overhead, not reading its weights: module calls, the cache
object's per-step concatenation, mask and rotary plumbing (the code zoo's draft has 2 layers of hidden size 256,
15 MB of weights). LeanLM runs the same computation as about fifteen torch ops per layer on the model's own
weights (lean_weights.py): RMSNorm, one fused qkv linear, rope, keys and values written into buffers
[layers, kv_heads, capacity, head_dim] that grow by doubling (no per-step concatenation), scaled_dot_product_attention
over the held slots, one fused gate/up linear. Linears on 2..8 rows of a CPU float32 input run as W @ x.T
(hf/few_row_linear.py) directly, without the torch function mode CachedLM enters.

Positions are pointers: `length` slots hold keys and values, `committed` of them are settled; a chain's rollback
moves `length` back and a tree's accepted branch is gathered down to the committed end. One row only
(`supports_rows` False): lean_draft.LeanDraft hands batches to CachedLM. The logits equal HF's forward to float
rounding (tests/test_backend_lean.py), so it is for draft models, whose tokens the target verifies; the target
always runs HF's own forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import DraftVerifyError
from ..types import TargetOutput
from .base import OneRow, kept_positions
from .hf.cached_lm import context_limit
from .hf.few_row_linear import few_row_linear, takes_few_rows
from .lean_weights import LeanWeights, Rope, unsupported

MIN_CAPACITY = 256  # slots allocated at least; the buffers double when a forward needs more
SLACK = 64  # slots check_fits reserves past the request for the widest draft tail (a tree's nodes)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's Llama RMSNorm: half-precision inputs are normalised in float32, as HF does."""
    if x.dtype in (torch.float32, torch.float64):
        return F.rms_norm(x, weight.shape, weight, eps)
    return weight * F.rms_norm(x.float(), weight.shape, None, eps).to(x.dtype)


class LeanLM(OneRow):
    """One Llama / Mistral / Qwen2 causal LM and its KV buffers, one row (the backend protocol, base.py)."""

    name = "lean"
    takes_positions = True  # scores token trees: model_tree's draft forwards a level per call with an ancestor mask
    exposes_hidden = False  # logits only: the drafters read a draft model's logits
    has_modules = False
    computes_in_torch = True  # plain torch ops
    is_encoder_decoder = False

    def __init__(self, model, role: str = "draft"):
        reason = unsupported(model)
        if reason is not None:
            raise DraftVerifyError(
                f"the {role} cannot run on the lean backend ({reason}); run it on CachedLM "
                "(lean_draft=False, or DRAFTVERIFY_LEAN_DRAFT=0)"
            )
        self.model = model
        self.role = role
        self.weights = LeanWeights.from_model(model)
        first = next(model.parameters())
        self.device, self.dtype = first.device, first.dtype
        self.vocab_size = int(self.weights.head.shape[0])
        self.max_positions = context_limit(model.config)
        self.rope = Rope(model, self.dtype, self.device)
        self.keys: torch.Tensor | None = None  # [layers, kv_heads, capacity, head_dim]
        self.values: torch.Tensor | None = None  # [layers, kv_heads, capacity, head_dim]
        self.ids: torch.Tensor | None = None  # [capacity] the token each slot holds (to hand the row to CachedLM)
        self.length = 0  # slots holding keys and values
        self.committed = 0  # settled slots; [committed, length) is the tail of the forwards since the last commit
        self.prefilled: TargetOutput | None = None

    @property
    def capacity(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]

    def check_fits(self, decoder_positions: int) -> None:
        if self.max_positions is not None and decoder_positions > self.max_positions:
            raise DraftVerifyError(
                f"the {self.role} model attends to at most {self.max_positions} positions, but this request needs "
                f"{decoder_positions} (prompt + max_new_tokens); shorten the prompt or lower max_new_tokens"
            )
        self._reserve(decoder_positions + SLACK)

    def _reserve(self, slots: int) -> None:
        """Grow the buffers (and the rope table) to hold at least `slots` positions, keeping what they hold."""
        if slots <= self.capacity:
            return
        capacity = max(slots, 2 * self.capacity, MIN_CAPACITY)
        w = self.weights
        shape = (len(w.layers), w.kv_heads, capacity, w.head_dim)
        with torch.inference_mode(False):  # written by later forwards, inside inference mode or not
            keys = torch.zeros(shape, dtype=self.dtype, device=self.device)
            values = torch.zeros(shape, dtype=self.dtype, device=self.device)
            ids = torch.zeros(capacity, dtype=torch.long, device=self.device)
        if self.length:
            keys[:, :, : self.length] = self.keys[:, :, : self.length]
            values[:, :, : self.length] = self.values[:, :, : self.length]
            ids[: self.length] = self.ids[: self.length]
        self.keys, self.values, self.ids = keys, values, ids
        self.rope.reserve(capacity)

    def start(
        self, input_ids: torch.Tensor, want_hidden: bool = False, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Reset and prefill input_ids [1, L] but the last token; `prefilled` holds the logits at L - 2 [1, 1, V]."""
        if input_ids.shape[0] != 1 or (attention_mask is not None and not bool(attention_mask.all())):
            raise DraftVerifyError(
                "the lean backend holds one unpadded row; run batches on CachedLM (LeanDraft hands them over)"
            )
        self._logits_only(want_hidden)
        self.length = self.committed = 0
        self.prefilled = None
        width = input_ids.shape[1]
        if width > 1:
            self._reserve(width - 1 + SLACK)
            logits = self._run(input_ids[0, :-1].to(self.device), None, self._visible(width - 1, None), keep=1)
            self.prefilled = TargetOutput(logits=logits[None])  # [1, 1, V]
            self.commit(width - 1)
        return input_ids

    def forward(
        self,
        tokens: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        want_hidden: bool = False,
        new_valid: torch.Tensor | None = None,
        logits_to_keep: int = 0,
    ) -> TargetOutput:
        """Append tokens [1, n] to the tail; their next-token logits [1, n, V] (the last min(logits_to_keep, n)
        alone when > 0). position_ids [1, n] (None: a chain after the tail); attention_mask bool [n, tail + n] or
        [1, n, tail + n] (None: causal)."""
        if tokens.shape[0] != 1 or (new_valid is not None and not bool(new_valid.all())):
            raise DraftVerifyError("the lean backend scores one row; run batches on CachedLM")
        self._logits_only(want_hidden)
        n = tokens.shape[1]
        keep = kept_positions(logits_to_keep, n)
        positions = None if position_ids is None else position_ids.reshape(-1)
        logits = self._run(tokens[0].to(self.device), positions, self._visible(n, attention_mask), keep=keep)
        return TargetOutput(logits=logits[None])  # [1, keep, V]

    def _logits_only(self, want_hidden: bool) -> None:
        if want_hidden:
            raise DraftVerifyError(
                "the lean backend returns logits only; a drafter that reads hidden states needs "
                "CachedLM (lean_draft=False)"
            )

    def _visible(self, n: int, attention_mask: torch.Tensor | None) -> torch.Tensor | None:
        """bool [n, length + n]: which held and new slots each new token attends to (None: all of them)."""
        end = self.length + n
        if attention_mask is None:
            return None if n == 1 else torch.ones(n, end, dtype=torch.bool, device=self.device).tril(self.length)
        tail = self.length - self.committed
        if (
            attention_mask.shape[-2:] != (n, tail + n)
            or attention_mask.dim() not in (2, 3)
            or attention_mask.dim() == 3
            and attention_mask.shape[0] != 1
        ):
            raise DraftVerifyError(
                f"attention mask must cover {n} new tokens x {tail + n} tail + new positions, "
                f"got {tuple(attention_mask.shape)}"
            )
        visible = torch.ones(n, end, dtype=torch.bool, device=self.device)
        visible[:, self.committed :] = attention_mask.reshape(n, tail + n).to(self.device)
        return visible

    def _run(
        self, ids: torch.Tensor, positions: torch.Tensor | None, visible: torch.Tensor | None, keep: int
    ) -> torch.Tensor:
        """Append ids [n] at slots [length, length + n) at positions [n] (None: the slots' own); the logits of the
        last `keep` [keep, V]."""
        w = self.weights
        n = ids.shape[0]
        start, end = self.length, self.length + n
        self._reserve(end)
        linear = few_row_linear if takes_few_rows(self.device, self.dtype, n) else F.linear
        heads, kv, dim = w.heads, w.kv_heads, w.head_dim
        cos, sin = self.rope.at(start, n, positions)  # [n, d] each
        cos, sin = cos[:, None], sin[:, None]  # [n, 1, d]
        self.ids[start:end] = ids
        x = F.embedding(ids, w.embed)  # [n, H]
        for i, layer in enumerate(w.layers):
            h = rms_norm(x, layer.norm_in, layer.eps_in)
            qkv = linear(h, layer.qkv, layer.qkv_bias).view(n, heads + 2 * kv, dim)  # [n, Hq + 2 Hkv, d]
            qk = qkv[:, : heads + kv]
            qk = qk * cos + qk.roll(dim // 2, -1) * sin  # rope on queries and keys at once: [n, Hq + Hkv, d]
            self.keys[i, :, start:end] = qk[:, heads:].transpose(0, 1)  # [Hkv, n, d]
            self.values[i, :, start:end] = qkv[:, heads + kv :].transpose(0, 1)
            att = F.scaled_dot_product_attention(
                qk[:, :heads].transpose(0, 1)[None],
                self.keys[i, :, :end][None],
                self.values[i, :, :end][None],
                attn_mask=visible,
                scale=w.scale,
                enable_gqa=heads != kv,
            )  # [1, Hq, n, d]
            x = x + linear(att[0].transpose(0, 1).reshape(n, heads * dim), layer.o, layer.o_bias)
            gate, up = linear(rms_norm(x, layer.norm_post, layer.eps_post), layer.gate_up, layer.gate_up_bias).chunk(
                2, dim=-1
            )  # [n, I] each
            x = x + linear(layer.act(gate) * up, layer.down, layer.down_bias)
        self.length = end
        x = rms_norm(x[n - keep :], w.norm, w.eps)  # [keep, H]
        head = few_row_linear if takes_few_rows(self.device, self.dtype, keep) else F.linear
        return head(x, w.head)  # [keep, V]

    def commit(self, kept: int | torch.Tensor) -> None:
        """Keep the tail's first `kept` slots (a chain: the pointer moves), or the tail offsets kept [1, k] / [k]
        in order (a tree's branch: gathered down to the committed end), and settle."""
        tail = self.length - self.committed
        if isinstance(kept, torch.Tensor):
            if kept.dim() == 2 and kept.shape[0] != 1:
                raise DraftVerifyError(f"the lean backend holds one row; got kept offsets for {kept.shape[0]} rows")
            offsets = kept.reshape(-1)
            count = offsets.numel()
            if count > tail:
                raise DraftVerifyError(f"cannot keep {count} positions of a {tail}-position tail")
            if count:
                index = self.committed + offsets.to(self.device)  # [k] (not range-checked: no host sync)
                end = self.committed + count
                self.keys[:, :, self.committed : end] = self.keys.index_select(2, index)
                self.values[:, :, self.committed : end] = self.values.index_select(2, index)
                self.ids[self.committed : end] = self.ids.index_select(0, index)
        else:
            count = int(kept)
            if not 0 <= count <= tail:
                raise DraftVerifyError(f"cannot keep {count} positions of a {tail}-position tail")
        self.length = self.committed = self.committed + count

    def rollback(self, length: int) -> None:
        """Drop every position from `length` on, settled or not (a pointer: the buffers keep their slots). A draft
        with its own tokenizer re-tokenizes the text at the boundary, which can change tokens it had settled."""
        if not 0 <= length <= self.length:
            raise DraftVerifyError(f"cannot roll back to {length} positions of {self.length}")
        self.length = length
        self.committed = min(self.committed, length)

    def fed_tokens(self) -> torch.Tensor:
        """The tokens the held slots were fed, in order [1, length] (LeanDraft re-prefills CachedLM with them)."""
        if self.ids is None:
            return torch.zeros(1, 0, dtype=torch.long, device=self.device)
        return self.ids[None, : self.length].clone()

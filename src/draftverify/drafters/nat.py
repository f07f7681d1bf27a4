"""SpecDec's non-autoregressive drafter (Xia et al., "Speculative Decoding: Exploiting Speculative Execution for
Accelerating Seq2seq Generation", section 3.1), for encoder-decoder and decoder-only targets.

Given the source and the accepted target prefix y_<=j, it predicts k tokens in one forward pass:
    y~_{j+1..j+k} = argmax sum_i log P(y~_{j+i} | y_<=j, x)
The decoder reads tokens and k - 1 [MASK] slots with bidirectional attention (no causal mask) and, like an AT
decoder, predicts from each position the token of the next one: y~_{j+1} at y_j, y~_{j+i} at the (i-1)-th mask. It
reads tokens through the target's embedding matrix and scores them with the target's output layer (both frozen,
passed in, never stored), so a drafter file holds only its decoder layers. What it cross-attends to depends on the
target (config.memory_window):

- encoder-decoder (memory_window 0): the *verifier's* encoder states, which the target computes once per generation
  anyway (the issue allows "its own encoder or the verifier's"); its input is [start, y_1..y_j, MASK x (k-1)]. No
  KV cache: the prefix is re-read every step, which bidirectional attention over it requires; captions are short.
  Its layers are post-LN, the layout of Marian, so `for_target` can start them from the target's own decoder
  layers (the usual initialisation of a NAT from its AT teacher).
- decoder-only (memory_window W > 0): there is no source, so the "source" is the target's own last-layer hidden
  states of the committed prefix, which the verify pass computes anyway (as for the blockwise heads; the drafter
  keeps the last W, appending the kept positions' states each step). Its input is only [y_j, MASK x (k-1)]: the
  prefix enters through those states, with an ALiBi recency bias (Press et al. 2022; the states carry no explicit
  position, and the latest ones matter most) and a LayerNorm on them (a decoder's final-norm outputs are far from
  unit scale). The cost of a draft is then bounded by W + k, whatever the prefix length.

The verifier decides what the draft is worth: `greedy` gives vanilla SpecDec (identical to AT greedy decoding),
`topbeta` gives SpecDec++; under sampling the drafter returns each slot's distribution q, so speculative sampling
stays lossless.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from ..backends.base import LMBackend, ModuleBackend, TargetModules, require_modules
from ..errors import DraftVerifyError
from ..sampling import draw_next, probs_from_logits
from ..types import DecodingState, Draft, TargetOutput, Verdict
from .base import Drafter, empty_draft
from .fingerprint import fingerprint_matches, weight_fingerprint
from .weights_folder import SavedModule, WeightsFolder

NAT_FORMAT = "draftverify-nat-drafter"
FOLDER = WeightsFolder("nat", NAT_FORMAT, "NAT drafter", "draftverify train nat")


def embedding_fingerprint(embeddings: nn.Module) -> str:
    """The target's input embedding's fingerprint (fingerprint.py): ties a drafter to the target it was trained on
    (it reads that matrix and that encoder), whatever dtype and device either is loaded at."""
    return weight_fingerprint(embeddings.weight)


@dataclass(frozen=True)
class NatConfig:
    hidden_size: int  # H: the target's d_model (its embeddings and encoder states)
    embed_scale: float  # the target decoder's embedding scale (sqrt(H) for Marian, 1 otherwise)
    layers: int
    heads: int
    ffn_size: int
    max_positions: int  # prefix + slots the drafter reads at once (longer prefixes keep their last tokens)
    block_size: int  # k it was trained for (the most slots it fills; fewer work too, see train/nat.py)
    vocab_size: int
    target_fingerprint: str  # embedding_fingerprint of the target
    # 0: an encoder-decoder target (the drafter reads its encoder states); W > 0: a decoder-only target (the drafter
    # reads its last W hidden states of the committed prefix)
    memory_window: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.memory_window, bool) or not isinstance(self.memory_window, int) or self.memory_window < 0:
            raise DraftVerifyError(
                f"NAT drafter config: memory_window must be an integer >= 0, got {self.memory_window!r}"
            )
        if not isinstance(self.embed_scale, (int, float)) or self.embed_scale <= 0:
            raise DraftVerifyError(f"NAT drafter config: embed_scale must be positive, got {self.embed_scale!r}")
        for name in ("hidden_size", "layers", "heads", "ffn_size", "max_positions", "block_size", "vocab_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise DraftVerifyError(f"NAT drafter config: {name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.heads:
            raise DraftVerifyError(
                f"NAT drafter config: hidden_size {self.hidden_size} is not divisible by heads {self.heads}"
            )

    def to_dict(self) -> dict:
        """For the trainer's checkpoints (which record every model's config)."""
        return asdict(self)


class NatDecoder(SavedModule):
    """Post-LN Transformer decoder layers without a causal mask, a learned [MASK] vector and positions."""

    weights_folder = FOLDER
    config_class = NatConfig

    def __init__(self, config: NatConfig):
        super().__init__(config)
        H = config.hidden_size
        self.mask_embedding = nn.Parameter(torch.randn(H) * H**-0.5)  # [H]
        self.positions = nn.Embedding(config.max_positions, H)
        layer = nn.TransformerDecoderLayer(
            H, config.heads, config.ffn_size, dropout=0.0, activation="relu", batch_first=True, norm_first=False
        )
        self.layers = nn.TransformerDecoder(layer, config.layers)
        if config.memory_window:  # decoder-only targets: normalised hidden states, ALiBi slopes per head
            self.memory_norm = nn.LayerNorm(H)
            slopes = 2.0 ** (-8.0 * torch.arange(1, config.heads + 1) / config.heads)  # [heads]
            self.register_buffer("slopes", slopes, persistent=False)

    @classmethod
    def for_target(
        cls,
        target: nn.Module,
        layers: int = 2,
        block_size: int = 8,
        max_positions: int = 256,
        ffn_size: int | None = None,
        heads: int | None = None,
        memory_window: int = 64,
    ) -> "NatDecoder":
        """A drafter sized for `target`; when the target's decoder has Marian's layout (post-LN layers, ReLU,
        sinusoidal positions) and `layers` of them, its last `layers` layers and positions are copied in.
        A decoder-only target gets a drafter over its last `memory_window` hidden states, with positions for the
        block_size slots only (max_positions is then block_size)."""
        vocab, hidden = target.get_input_embeddings().weight.shape
        cfg = target.config
        if getattr(cfg, "is_encoder_decoder", False):
            heads = heads or getattr(cfg, "decoder_attention_heads", None) or 4
            ffn_size = ffn_size or getattr(cfg, "decoder_ffn_dim", 4 * hidden)
            scale = hidden**0.5 if getattr(cfg, "scale_embedding", False) else 1.0
            window = 0
        else:
            heads = heads or getattr(cfg, "num_attention_heads", None) or getattr(cfg, "n_head", None) or 4
            ffn_size = ffn_size or getattr(cfg, "intermediate_size", None) or 4 * hidden
            scale, window, max_positions = 1.0, memory_window, block_size
        config = NatConfig(
            hidden,
            scale,
            layers,
            heads,
            ffn_size,
            max_positions,
            block_size,
            vocab,
            embedding_fingerprint(target.get_input_embeddings()),
            window,
        )
        nat = cls(config)
        decoder = getattr(getattr(target, "model", None), "decoder", None)
        if getattr(cfg, "model_type", None) == "marian" and getattr(cfg, "activation_function", None) == "relu":
            nat.copy_from_marian(decoder)
        return nat

    @torch.no_grad()
    def copy_from_marian(self, decoder: nn.Module) -> None:
        """Start from a Marian decoder's last layers and positions (where the shapes agree)."""
        theirs = list(decoder.layers)[-self.config.layers :]
        ours = list(self.layers.layers)
        if (
            len(theirs) != len(ours)
            or theirs[0].fc1.out_features != self.config.ffn_size
            or theirs[0].self_attn.num_heads != self.config.heads
        ):
            return
        for src, dst in zip(theirs, ours):
            for a, b in ((src.self_attn, dst.self_attn), (src.encoder_attn, dst.multihead_attn)):
                b.in_proj_weight.copy_(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
                b.in_proj_bias.copy_(torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]))
                b.out_proj.weight.copy_(a.out_proj.weight)
                b.out_proj.bias.copy_(a.out_proj.bias)
            for a, b in (
                (src.fc1, dst.linear1),
                (src.fc2, dst.linear2),
                (src.self_attn_layer_norm, dst.norm1),
                (src.encoder_attn_layer_norm, dst.norm2),
                (src.final_layer_norm, dst.norm3),
            ):
                b.weight.copy_(a.weight)
                b.bias.copy_(a.bias)
        table = decoder.embed_positions.weight
        n = min(len(table), self.config.max_positions)
        self.positions.weight[:n] = table[:n]

    def forward(
        self,
        target: TargetModules | nn.Module,
        tokens: torch.Tensor,
        slots: torch.Tensor,
        memory: torch.Tensor,
        memory_mask: torch.Tensor | None = None,
        padding: torch.Tensor | None = None,
        memory_end: torch.Tensor | None = None,
        last: int = 0,
    ) -> torch.Tensor:
        """Logits [B, T, V] at every input position (only the last `last` when > 0: decoding needs just the slots',
        and the output layer over the vocabulary is the drafter's largest matmul): t predicts the token of t + 1.

        target: the target's TargetModules (a backend's modules()), or the Hugging Face model itself (training);
        tokens [B, T]: the prefix ids (any id where slots is True); slots [B, T] bool: [MASK] positions;
        memory [B, S, H]: the target's encoder states (or a decoder-only target's hidden states);
        memory_mask [B, S]: 1 for real source tokens; padding [B, T] bool: True at padded positions (training).
        memory_end [B, n] (decoder-only drafters): tokens are n blocks of k = T / n, each [y_p, MASK x (k-1)];
        block j attends only to itself and to the memory positions [end - W, end) (the states before its y_p).
        """
        if not isinstance(target, TargetModules):
            target = TargetModules.of(target)
        emb = target.input_embeddings(tokens).to(self.mask_embedding.dtype) * self.config.embed_scale
        emb = torch.where(slots[..., None], self.mask_embedding, emb)  # [B, T, H]
        memory = memory.to(emb.dtype)
        self_mask = cross_mask = None
        if memory_end is None:
            pos = torch.arange(tokens.shape[1], device=tokens.device)  # [T]
        else:
            n = memory_end.shape[1]
            k = tokens.shape[1] // n
            pos = torch.arange(k, device=tokens.device).repeat(n)  # [n*k]: each block's slots from 0
            self_mask = self.block_mask(n, k, emb.dtype, emb.device)
            cross_mask = self.recency_bias(memory_end, k, memory.shape[1], emb.dtype)
            if memory_mask is not None:  # a batch's left padding of the memory, folded into the float mask
                padded = (memory_mask == 0).repeat_interleave(self.config.heads, dim=0)[:, None, :]  # [B*heads, 1, S]
                cross_mask = cross_mask.masked_fill(padded, float("-inf"))
                memory_mask = None
            memory = self.memory_norm(memory)
        x = emb + self.positions(pos)
        mem_pad = None if memory_mask is None else memory_mask == 0
        x = self.layers(
            x,
            memory,
            tgt_mask=self_mask,
            memory_mask=cross_mask,
            tgt_key_padding_mask=padding,
            memory_key_padding_mask=mem_pad,
        )
        return target.logits(x[:, -last:] if last else x)

    @staticmethod
    def block_mask(n: int, k: int, dtype: torch.dtype, device) -> torch.Tensor:
        """[n*k, n*k] additive self-attention mask: bidirectional within each block of k, -inf across blocks."""
        block = torch.arange(n * k, device=device) // k
        same = block[:, None] == block[None, :]
        return torch.zeros(n * k, n * k, dtype=dtype, device=device).masked_fill(~same, float("-inf"))

    def recency_bias(self, memory_end: torch.Tensor, k: int, S: int, dtype: torch.dtype) -> torch.Tensor:
        """[B*heads, n*k, S] additive cross-attention mask: block j sees memory positions s in [end_j - W, end_j)
        with ALiBi's bias -slope_h * (end_j - 1 - s), and nothing else (-inf)."""
        B, n = memory_end.shape
        distance = memory_end[:, :, None] - 1 - torch.arange(S, device=memory_end.device)  # [B, n, S]
        visible = (distance >= 0) & (distance < self.config.memory_window)
        bias = -self.slopes[None, :, None, None] * distance[:, None].to(self.slopes.dtype)  # [B, heads, n, S]
        bias = bias.masked_fill(~visible[:, None], float("-inf")).repeat_interleave(k, dim=2)  # [B, heads, n*k, S]
        return bias.reshape(B * self.config.heads, n * k, S).to(dtype)

    def check_target(self, target: TargetModules) -> None:
        """Refuse a drafter trained for another target: it reads that target's embeddings and encoder."""
        vocab, hidden = target.input_embeddings.weight.shape
        if (hidden, vocab) != (self.config.hidden_size, self.config.vocab_size):
            raise DraftVerifyError(
                f"the NAT drafter was trained for a target with d_model {self.config.hidden_size} and "
                f"{self.config.vocab_size} tokens, but this target has {hidden} and {vocab}; train one for it with "
                "`draftverify train nat`"
            )
        found = embedding_fingerprint(target.input_embeddings)
        if not fingerprint_matches(self.config.target_fingerprint, target.input_embeddings.weight):
            raise DraftVerifyError(
                "the NAT drafter was trained for another target (embedding fingerprint "
                f"{self.config.target_fingerprint}, this target's is {found}); train one for it with "
                "`draftverify train nat`"
            )


class NatDrafter(Drafter):
    """Fills gamma [MASK] slots after the committed tokens in one forward (gamma = SpecDec's block size k).

    Greedy: each slot's argmax (the paper's draft). Sampling: each slot's token is drawn from its own filtered
    distribution, returned as q, so the exact sampling verifiers stay exact. For a decoder-only target it keeps the
    target's hidden states of the committed prefix, all but the pending token's (the last W of them), from the
    prefill and from each verify pass (needs_target_hidden). In a batch each row keeps its own last W states,
    right-aligned (rows that kept fewer are padded on the left and the padding is masked); a row with none yet (a
    one-token prompt) drafts nothing that step.
    """

    needs_target_modules = "the target's Hugging Face modules (the NAT drafter runs over its layers)"
    supports_batch = True

    def __init__(self, nat: NatDecoder):
        super().__init__()
        self.nat = nat.eval()
        self.window = nat.config.memory_window  # 0: encoder-decoder target
        self.needs_target_hidden = self.window > 0
        self.target: ModuleBackend | None = None
        self._modules: TargetModules | None = None  # the target's embedding and output layer (bind)
        self._memory: torch.Tensor | None = None  # [B, M <= W, H]: decoder-only targets' kept hidden states
        self._held: torch.Tensor | None = None  # [B, M] bool: which of them are real (right-aligned per row)

    @classmethod
    def from_options(cls, target: LMBackend, options) -> "NatDrafter":
        if options.nat_path is None:
            from ..options.nat import nat_advice

            raise DraftVerifyError(
                "the NAT drafter needs trained weights: "
                f"{nat_advice(translation=bool(getattr(target, 'is_encoder_decoder', False)))}"
            )
        return cls(NatDecoder.load(options.nat_path))

    def bind(self, target: LMBackend, max_positions: int) -> None:
        target = require_modules(target, "the NAT drafter")
        if target.is_encoder_decoder and self.window:
            raise DraftVerifyError(
                "this NAT drafter was trained for a decoder-only target (it reads its hidden states); "
                "for this encoder-decoder target train one with `draftverify train nat --target DIR`"
            )
        if not target.is_encoder_decoder and not self.window:
            raise DraftVerifyError(
                "this NAT drafter was trained for an encoder-decoder target (it reads its encoder "
                "states); for this decoder-only target train one with `draftverify train nat "
                "--target DIR`"
            )
        self._modules = target.modules()
        self.nat.check_target(self._modules)
        self.nat.to(device=target.device, dtype=target.dtype)
        self.target = target

    def start(self, state: DecodingState, prefilled: TargetOutput | None = None) -> None:
        self._memory = self._held = None
        if prefilled is not None and self.window:
            width = prefilled.hidden.shape[1]  # the prefilled positions, left-padded: each row's real ones last
            real = torch.arange(width, device=state.lengths.device)[None] >= (width + 1 - state.lengths)[:, None]
            self._keep(prefilled.hidden, real)

    def _keep(self, states: torch.Tensor, real: torch.Tensor) -> None:
        """Each row's real states [B, S, H] (real [B, S]) moved to the right, the last W of them kept."""
        order = real.long().argsort(dim=1, stable=True)  # padding first, real states in their order last
        held = real.gather(1, order)[:, -self.window :]  # [B, M]
        self._memory = states.gather(1, order.to(states.device)[..., None].expand(-1, -1, states.shape[-1]))
        self._memory = self._memory[:, -self.window :]  # [B, M <= W, H]
        self._held = held.to(self._memory.device)

    def commit(self, state: DecodingState, verdict: Verdict, scored: TargetOutput | None = None) -> None:
        if self.window:  # the states of the pending token and the kept drafts: all but the new pending token's
            kept = verdict.num_accepted + 1  # [B] this step's states per row, right-aligned in scored
            width = scored.hidden.shape[1]
            new = torch.arange(width, device=kept.device)[None] >= (width - kept)[:, None]  # [B, K]
            if self._memory is None:
                self._keep(scored.hidden, new)
            else:
                self._keep(
                    torch.cat([self._memory, scored.hidden], dim=1),
                    torch.cat([self._held, new.to(self._held.device)], dim=1),
                )

    def drop_rows(self, keep: torch.Tensor) -> None:
        if self._memory is not None:
            self._memory = self._memory[keep.to(self._memory.device)]
            self._held = self._held[keep.to(self._held.device)]

    def join_rows(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        """Rows that join hold no states until their first verify pass: they draft nothing that step."""
        if self._memory is not None:
            rows = input_ids.shape[0]
            self._memory = torch.cat([self._memory, self._memory.new_zeros((rows,) + tuple(self._memory.shape[1:]))])
            self._held = torch.cat([self._held, self._held.new_zeros((rows, self._held.shape[1]))])

    @torch.no_grad()
    def slot_logits(self, state: DecodingState, gamma: int) -> torch.Tensor | None:
        """[B, k, V]: the logits of the k slots after the committed tokens (None: nothing to read yet)."""
        if self.window:
            if self._memory is None:  # a one-token prompt: nothing was prefilled, so the first step drafts nothing
                return None
            k = min(gamma, self.nat.config.max_positions)
            tokens = torch.cat([state.tokens[:, -1:], state.tokens.new_zeros((state.tokens.shape[0], k - 1))], dim=1)
            slots = torch.ones_like(tokens, dtype=torch.bool)
            slots[:, 0] = False  # [y_j, MASK x (k-1)]
            end = torch.full((tokens.shape[0], 1), self._memory.shape[1], device=tokens.device)  # [B, 1]
            held = self._held.clone()
            held[:, -1] = True  # a row with no states yet reads a zero one (its draft is dropped in propose)
            mask = None if bool(held.all()) else held.long()
            return self.nat(self._modules, tokens, slots, self._memory, memory_mask=mask, memory_end=end)  # [B, k, V]
        k = min(gamma, self.nat.config.max_positions - 1)
        prefix = state.tokens[:, -(self.nat.config.max_positions - k + 1) :]  # [B, L]
        B, L = prefix.shape
        tokens = torch.cat([prefix, prefix.new_zeros((B, k - 1))], dim=1)  # [B, L+k-1]: k-1 masks
        slots = torch.zeros_like(tokens, dtype=torch.bool)
        slots[:, L:] = True
        states, source_mask = self.target.encoder_states()  # [B, S, H], [B, S]
        return self.nat(self._modules, tokens, slots, states, source_mask, last=k)  # [B, k, V]: from the last token on

    def propose(self, state: DecodingState, gamma: int) -> Draft:
        logits = self.slot_logits(state, gamma)
        if logits is None:
            return empty_draft(state)
        self.forward_calls += 1
        if state.params.greedy:
            draft = Draft(tokens=logits.argmax(dim=-1))
        else:
            q = probs_from_logits(logits, state.params)  # [B, k, V]
            draft = Draft(
                tokens=torch.stack([draw_next(q[:, i], state, i) for i in range(q.shape[1])], dim=1), q_probs=q
            )
        if self._held is not None and not bool(self._held[:, -1].all()):  # rows without states propose nothing
            draft.lengths = torch.where(self._held[:, -1].to(draft.tokens.device), draft.length, 0)
        return draft

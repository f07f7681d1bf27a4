"""EAGLE-3 drafting (Li et al. 2025): a one-layer head reads the target's own features and drafts a chain.

The method wraps the target (as EAGLE's EaModel does): `LayerInputsTarget` returns, as each forward's hidden
states, the inputs of three of the target's layers concatenated [B, n, 3H], read with forward pre-hooks while the
target runs its own forward, so the verify pass that scores a draft also yields the next draft's features.

Positions (the convention of EAGLE-3 and llama.cpp's draft-eagle3): the head's position j holds the pair (g_j, token
j + 1), where g_j is fc of the target's features at position j; its output predicts token j + 2. The committed
sequence's last token (the pending one) has no features yet, so a draft starts from the pair (g_{T-2}, token T-1),
after feeding every pair since the last draft in one head forward; each next draft token is the pair (the head's
own prenorm state, the token just drafted). The head's cache keeps only pairs built from the target's features:
the drafted positions are cut off when the verdict arrives.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

import torch
from torch import nn

from ..backends.base import LMBackend, kept_positions, require_modules
from ..errors import DraftVerifyError
from ..sampling import argmax, draw_next, probs_from_logits
from ..types import DecodingState, Draft, TargetOutput, Verdict
from .base import Drafter, empty_draft
from .eagle3_head import Eagle3Head, HeadCache
from .wrapped_target import WrappedTarget


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """A decoder-only transformers model's list of decoder layers (config.num_hidden_layers of them)."""
    count = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    if isinstance(layers, nn.ModuleList) and len(layers) == count:
        return layers
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) == count:
            return module
    raise DraftVerifyError(
        f"eagle3 reads the inputs of the target's decoder layers, but {type(model).__name__} has no list of "
        f"{count} layers; use a Llama-style decoder-only target"
    )


class LayerInputsTarget(WrappedTarget):
    """The wrapped target: forward and start return, as hidden states, the inputs of three of its layers
    concatenated [B, n, 3H] instead of the last layer's; everything else is the target's own. Also what the head
    reads of the target's weights: its token embedding and LM head (`embedding`, `lm_head`), layer count, and
    whether those weights are the original ones (`exact_weights`: a quantized GGUF's are not)."""

    embedding: nn.Module
    lm_head: nn.Module
    num_layers: int
    exact_weights: bool = True

    def __init__(self, target: LMBackend):
        super().__init__(target)
        self.prefilled: TargetOutput | None = None
        # [B, P, 3H] right-aligned, each row's last earlier_counts [B]: the features of the prompt positions a
        # forward decoded before its scored tokens (llama.cpp decodes a deferred prompt with the first step), for
        # the drafter to take with that step's
        self.earlier: torch.Tensor | None = None
        self.earlier_counts: torch.Tensor | None = None

    def forward(
        self,
        tokens: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        want_hidden: bool = False,
        new_valid: torch.Tensor | None = None,
        logits_to_keep: int = 0,
    ) -> TargetOutput:
        """The target's forward of tokens [B, n] (its own hidden states not asked for); hidden: the chosen layers'
        inputs at those tokens [B, n, 3H] when want_hidden. logits_to_keep cuts the logits alone, after a forward
        of every position's (a backend reads layer inputs only where it makes outputs). Each backend reads them its
        own way: `_reading` around the forward, `_read` after it."""
        n = tokens.shape[1]
        with self._reading() as seen:
            out = self.target.forward(tokens, position_ids, attention_mask, False, new_valid)
        logits = out.logits[:, n - kept_positions(logits_to_keep, n) :]
        return TargetOutput(logits=logits, hidden=self._read(seen, n, want_hidden))

    def _reading(self) -> AbstractContextManager:
        """Open around the target's forward: what it yields is what `_read` gets (nothing: nullcontext)."""
        return nullcontext()

    def _read(self, seen, count: int, want_hidden: bool) -> torch.Tensor | None:
        """After the forward of `count` tokens: their features [B, count, 3H], or None when not wanted."""
        raise NotImplementedError

    @staticmethod
    def of(target: LMBackend, layers: tuple[int, ...]) -> "LayerInputsTarget":
        """The wrapper that fits the backend: Hugging Face modules hooked, or llama.cpp's own extraction."""
        if getattr(target, "has_modules", False):
            return HookedLayerInputs(target, layers)
        if callable(getattr(target, "capture_layer_inputs", None)):
            return LlamaCppLayerInputs(target, layers)
        raise DraftVerifyError(
            f"eagle3 reads the inputs of the target's layers, which the {target.name} backend does not give; run it "
            "with --backend hf or --backend llamacpp"
        )


class HookedLayerInputs(LayerInputsTarget):
    """A Hugging Face target: forward pre-hooks on the chosen decoder layers read their inputs while it runs."""

    def __init__(self, target: LMBackend, layers: tuple[int, ...]):
        super().__init__(target)
        backend = require_modules(target, "eagle3")
        if backend.is_encoder_decoder:
            raise DraftVerifyError("eagle3 drafts for a decoder-only target; use a draft model for encoder-decoders")
        model = backend.module()
        decoder = decoder_layers(model)
        self.layers = [decoder[i] for i in layers]
        modules = backend.modules()
        self.embedding, self.lm_head = modules.input_embeddings, modules.output_embeddings
        self.num_layers = len(decoder)

    @contextmanager
    def _capture(self) -> Iterator[list[list[torch.Tensor]]]:
        """While open, each chosen layer's input of every call is appended to its list."""
        seen: list[list[torch.Tensor]] = [[] for _ in self.layers]

        def hook_for(i: int):
            def hook(module, args, kwargs):
                seen[i].append(args[0] if args else kwargs["hidden_states"])

            return hook

        handles = [
            layer.register_forward_pre_hook(hook_for(i), with_kwargs=True) for i, layer in enumerate(self.layers)
        ]
        try:
            yield seen
        finally:
            for handle in handles:
                handle.remove()

    def _fused(self, seen: list[list[torch.Tensor]], count: int) -> torch.Tensor:
        """The last call's inputs at its last `count` positions, concatenated [B, count, 3H]."""
        if any(not inputs for inputs in seen):
            raise DraftVerifyError(
                "eagle3 reads the inputs of the target's layers, which a compiled target does not expose; run it "
                "without --compile (compile=False)"
            )
        return torch.cat([inputs[-1][:, inputs[-1].shape[1] - count :] for inputs in seen], dim=-1)

    def start(
        self,
        input_ids: torch.Tensor,
        want_hidden: bool = False,
        attention_mask: torch.Tensor | None = None,
        prompt_logits: bool = False,
    ) -> torch.Tensor:
        with self._capture() as seen:
            committed = self.target.start(input_ids, False, attention_mask, prompt_logits)
        prefilled = self.target.prefilled
        hidden = self._fused(seen, input_ids.shape[1] - 1) if want_hidden and prefilled is not None else None
        self.prefilled = None if prefilled is None else TargetOutput(logits=prefilled.logits, hidden=hidden)
        return committed

    def _reading(self) -> AbstractContextManager:
        return self._capture()

    def _read(self, seen: list[list[torch.Tensor]], count: int, want_hidden: bool) -> torch.Tensor | None:
        return self._fused(seen, count) if want_hidden else None


class LlamaCppLayerInputs(LayerInputsTarget):
    """A llama.cpp target: its context keeps the chosen layers' inputs at every decoded position (llama.cpp's own
    extraction, the one its draft-eagle3 reads); the token embedding and LM head are read from its GGUF file."""

    def __init__(self, target: LMBackend, layers: tuple[int, ...]):
        super().__init__(target)
        self.layers = layers  # extracted from each request's start on (capture_layer_inputs)
        self.num_layers = target.check_layers(layers)  # type: ignore[attr-defined]
        self.dtype = torch.float32  # llama.cpp hands its features over as float32

    @functools.cached_property
    def _token_tensors(self) -> tuple[nn.Module, nn.Module, bool]:
        """Read from the GGUF file when a torch head first asks (a GGUF head reads them in llama.cpp)."""
        from ..backends.gguf import token_tensors

        embedding, output, exact = token_tensors(self.target.model.path)  # type: ignore[attr-defined]
        lm_head = nn.Linear(output.shape[1], output.shape[0], bias=False)
        lm_head.weight = nn.Parameter(output, requires_grad=False)
        return nn.Embedding.from_pretrained(embedding), lm_head, exact

    @property
    def embedding(self) -> nn.Module:  # type: ignore[override]
        return self._token_tensors[0]

    @property
    def lm_head(self) -> nn.Module:  # type: ignore[override]
        return self._token_tensors[1]

    @property
    def exact_weights(self) -> bool:  # type: ignore[override]
        return self._token_tensors[2]

    def start(
        self,
        input_ids: torch.Tensor,
        want_hidden: bool = False,
        attention_mask: torch.Tensor | None = None,
        prompt_logits: bool = False,
    ) -> torch.Tensor:
        """The prompt stays deferred: the first step (which drafts nothing, having no features yet) decodes it
        with the pending token in one piece, as llama.cpp's own greedy decoding does, and its features come back
        then (`earlier`). The backend's start drops an earlier request's extraction; this request asks again."""
        self.prefilled, self.earlier, self.earlier_counts = None, None, None
        committed = self.target.start(input_ids, False, attention_mask, prompt_logits)
        self.target.capture_layer_inputs(self.layers)  # type: ignore[attr-defined]
        return committed

    def _read(self, seen: None, count: int, want_hidden: bool) -> torch.Tensor | None:
        """Every forward takes what llama.cpp kept (so the next one starts empty) and keeps the features of any
        prompt positions it decoded before the scored tokens as `earlier`."""
        if self.target.seqs is not None:  # type: ignore[attr-defined]  rows: each row's, from llamacpp_rows.py
            hidden, prompts = self.target.take_row_layer_inputs()  # type: ignore[attr-defined]  [B, n, 3H]
            self.earlier, self.earlier_counts = right_aligned(prompts) if any(len(p) for p in prompts) else (None, None)
            return hidden if want_hidden else None
        features = self.target.take_layer_inputs()[None]  # type: ignore[attr-defined]  [1, m, 3H]
        scored = features.shape[1] - count  # rows before the scored tokens: the deferred prompt's
        self.earlier = features[:, :scored] if scored else None
        self.earlier_counts = torch.tensor([scored]) if scored else None
        return features[:, scored:] if want_hidden else None


class Eagle3Drafter(Drafter):
    """Drafts a chain with the EAGLE-3 head: greedy takes its argmax, sampling draws from its distribution
    (returned as q, so the exact verifier keeps the target's distribution).

    Rows (left-padded, as the target's): a row's pairs are fed as its features come (each verify pass keeps a
    different number per row), so the head's cache columns hold real pairs for some rows and padding for others;
    `_real` [B, P] says which, and every head forward masks the rest out. Each row's pairs sit at its own positions
    (its real token index), so a row's drafts are what it would draft alone. A row that joined between steps has
    no features of its prompt: it drafts from the pairs of the tokens decoded since."""

    needs_target_hidden = True
    hidden_from_wrapper = True  # the layer inputs, read by LayerInputsTarget on the hf and llamacpp backends
    supports_batch = True

    def __init__(self, head: Eagle3Head | None):
        super().__init__()
        self.head = head.eval() if head is not None else None  # None: a subclass runs the head (Eagle3GgufDrafter)
        self.target: LayerInputsTarget | None = None  # bind's: the wrapped target
        self.embed: nn.Module | None = None
        self.lm_head: nn.Module | None = None
        self.cache = HeadCache()
        self._real = torch.zeros(1, 0, dtype=torch.bool)  # [B, P] the cache columns that are each row's real pairs
        # [B, m, 3H] features not fed yet, right-aligned: row b's are its last _counts[b] (its positions up to the
        # one before its pending token)
        self._features: torch.Tensor | None = None
        self._counts = torch.zeros(1, dtype=torch.long)  # [B]
        self._kept = 0  # cache columns holding pairs built from the target's features (drafted ones come after)
        self._all_real = True  # every cache column is a real pair of every row (no mask needed): a host flag

    @classmethod
    def from_options(cls, target: LMBackend, options) -> "Eagle3Drafter":
        if cls is Eagle3Drafter and is_gguf(options.eagle3_path):
            return Eagle3GgufDrafter(options.eagle3_path)
        return cls(cls.load_head(options))

    @classmethod
    def load_head(cls, options) -> Eagle3Head:
        if options.eagle3_path is None:
            raise DraftVerifyError(
                f"{cls.name} needs a trained EAGLE-3 head: pass eagle3_path=... (CLI: --eagle3 DIR; `draftverify "
                "train eagle3` makes one)"
            )
        if is_gguf(options.eagle3_path):
            raise DraftVerifyError(
                f"{cls.name} runs the head in torch: pass the head's folder (config.json + model.safetensors), not "
                f"{options.eagle3_path} (a GGUF head runs with the eagle3 method on --backend llamacpp)"
            )
        return Eagle3Head.load(options.eagle3_path)

    @property
    def aux_layers(self) -> tuple[int, ...]:
        """The target layers whose inputs the head reads."""
        return self.head.config.aux_layers

    def wrap_target(self, target: LMBackend) -> LMBackend:
        if isinstance(target, LayerInputsTarget):
            return target  # type: ignore[return-value]
        return LayerInputsTarget.of(target, self.aux_layers)  # type: ignore[return-value]

    def bind(self, target: LMBackend, max_positions: int) -> None:
        if not isinstance(target, LayerInputsTarget):
            raise DraftVerifyError("eagle3 runs on the target its wrap_target() returned (the loop calls it)")
        self.target = target
        self.embed, self.lm_head = target.embedding, target.lm_head
        self.head.check_target(self.lm_head, target.num_layers, fingerprint=target.exact_weights)
        self.head.to(device=target.device, dtype=target.dtype)

    def start(self, state: DecodingState, prefilled: TargetOutput | None = None) -> None:
        device = state.tokens.device
        self.cache = HeadCache()
        self._real = torch.zeros(state.tokens.shape[0], 0, dtype=torch.bool, device=device)
        self._features = None if prefilled is None else prefilled.hidden  # [B, L-1, 3H] positions 0..L-2
        self._counts = (state.lengths - 1).clamp_min(0) if prefilled is not None else torch.zeros_like(state.lengths)
        self._kept = 0
        self._all_real = True

    def catch_up(self, state: DecodingState) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed the head, in one forward, every pair whose features the verify passes since the last draft gave;
        returns the last pair's prenorm state [B, 1, H] (its logits predict the token after the pending one) and
        each row's pending token position [B]."""
        assert self._features is not None  # set by start / commit
        features = self._features
        m = features.shape[1]
        end = state.lengths - 1  # [B] the pending tokens' positions
        g = self._encode(features)  # [B, m, H]
        tokens = state.tokens[:, -m:]  # [B, m] pair j's token: the row's token at position end - m + j + 1
        column = torch.arange(m, device=g.device)
        positions = (end[:, None] - m + column).clamp_min(0)  # [B, m]
        fresh = column[None] >= (m - self._counts)[:, None]  # [B, m] the row's real pairs (right-aligned)
        self._all_real = self._all_real and (fresh.shape[0] == 1 or bool(fresh.all()))  # one row: always real
        prenorm = self._step(tokens, g, positions, fresh)  # [B, 1, H]
        self._real = torch.cat([self._real, fresh], dim=1)
        self._kept += m
        self._features, self._counts = None, torch.zeros_like(self._counts)
        self.forward_calls += 1
        return prenorm, end

    def mask(self, fresh: torch.Tensor) -> torch.Tensor | None:
        """What new pairs see [B, n, P + n] (fresh [B, n]: which are real): each row's real cached pairs and the
        real new ones up to itself (a padding pair sees itself only); None where every pair is real (the head's
        own causal mask)."""
        if self._all_real:  # and so is every new pair: catch_up's, and the drafted ones
            return None
        n = fresh.shape[1]
        causal = torch.ones(n, n, dtype=torch.bool, device=fresh.device).tril()  # [n, n]
        new = (causal[None] & fresh[:, None, :]) | torch.eye(n, dtype=torch.bool, device=fresh.device)
        return torch.cat([self._real[:, None, :].expand(-1, n, -1), new], dim=2)

    @torch.no_grad()
    def propose(self, state: DecodingState, gamma: int) -> Draft:
        if self._features is None:  # a one-token prompt: no features yet, the first step drafts nothing
            return empty_draft(state)
        params = state.params
        prenorm, end = self.catch_up(state)
        ready = self._real.any(dim=1)  # [B] rows with a real pair: the others (just joined) draft nothing yet
        stop = state.draft_confidence
        drafting = ready.clone()  # [B] rows still confident: the draft ends when none is (every row keeps its length,
        # as the model drafter's rows do: its own stop would save no head step, and its later tokens are its draws)
        drafted: list[torch.Tensor] = []
        q: list[torch.Tensor] = []
        while True:
            probs = probs_from_logits(self._logits(prenorm), params)  # [B, V]
            token = argmax(probs) if params.greedy else draw_next(probs, state, len(drafted))  # [B]
            drafted.append(token)
            q.append(probs)
            if stop > 0:
                drafting &= probs.amax(dim=-1) > stop
            if len(drafted) >= gamma or not bool(drafting.any()):
                break
            position = (end + len(drafted) - 1)[:, None]  # [B, 1]
            real = torch.ones_like(position, dtype=torch.bool)  # [B, 1]
            prenorm = self._step(token[:, None], prenorm, position, real)
            self._real = torch.cat([self._real, real], dim=1)
            self.forward_calls += 1
        draft = Draft(tokens=torch.stack(drafted, dim=1), q_probs=torch.stack(q, dim=1))  # [B, N], [B, N, V]
        if not bool(ready.all()):
            draft.lengths = ready.long() * draft.length  # [B]
        return draft

    # ---- the head's runtime (torch here; eagle3_gguf.py runs the head's GGUF on llama.cpp) ----------------------
    def _encode(self, features: torch.Tensor) -> torch.Tensor:
        """The target's fused features [B, m, 3H] -> g [B, m, H]."""
        return self.head.fc(features.to(self.head.fc.weight.dtype))

    def _step(
        self, tokens: torch.Tensor, g: torch.Tensor, positions: torch.Tensor, fresh: torch.Tensor
    ) -> torch.Tensor:
        """Feed the pairs (g [B, n, H], tokens [B, n]) at positions [B, n] (fresh [B, n]: which are real) into the
        head's cache; the last pair's prenorm state [B, 1, H]."""
        assert self.embed is not None  # set by bind
        return self.head.step(self.cache, self.embed(tokens), g, positions, self.mask(fresh))[:, -1:]

    def _logits(self, prenorm: torch.Tensor) -> torch.Tensor:
        """A prenorm state [B, 1, H] -> the head's logits [B, V] for the token after its pair's."""
        assert self.lm_head is not None  # set by bind
        return self.head.logits(prenorm, self.lm_head)[:, -1]

    def _truncate(self, length: int) -> None:
        """Keep the first `length` pairs of the head's cache."""
        self.cache.truncate(length)

    def commit(self, state: DecodingState, verdict: Verdict, scored: TargetOutput | None = None) -> None:
        """The drafted columns leave the cache; the verify pass's features of each row's pending token and kept
        drafts [B, 1 + accepted, 3H] (right-aligned) wait for the next draft."""
        self._truncate(self._kept)
        self._real = self._real[:, : self._kept]
        assert scored is not None and scored.hidden is not None  # needs_target_hidden: the wrapper's features
        fresh, counts = scored.hidden, verdict.num_accepted.to(self._counts.device) + 1  # [B, k, 3H], [B]
        assert self.target is not None  # set by bind
        earlier, earlier_counts = self.target.earlier, self.target.earlier_counts
        if self._kept == 0 and self._features is None and earlier is not None and earlier_counts is not None:
            # the prompts decoded with the first step (llama.cpp), before each row's pending token and drafts
            fresh, counts = join_right_aligned(earlier, earlier_counts.to(counts.device), fresh, counts)
        if self._features is None:
            self._features, self._counts = fresh, counts
        else:  # a step without a proposal: both right-aligned blocks, row by row
            self._features, self._counts = join_right_aligned(self._features, self._counts, fresh, counts)

    def drop_rows(self, keep: torch.Tensor) -> None:
        rows = keep.to(self._counts.device)
        self.cache.select(rows)
        self._real, self._counts = self._real[rows], self._counts[rows]
        if self._features is not None:
            self._features = self._features[rows]

    def join_rows(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        """New rows start with nothing fed: their prompts' features are not available (the target prefilled them
        without the drafter); they draft from the pairs of the tokens they decode from now on."""
        rows = input_ids.shape[0]
        self.cache.join(rows)
        self._all_real = self._all_real and self._real.shape[1] == 0
        self._real = torch.cat([self._real, self._real.new_zeros((rows, self._real.shape[1]))])
        self._counts = torch.cat([self._counts, self._counts.new_zeros(rows)])
        if self._features is not None:
            self._features = torch.cat([self._features, self._features.new_zeros((rows, *self._features.shape[1:]))])


class Eagle3GgufDrafter(Eagle3Drafter):
    """eagle3 with the head as its GGUF file on a llama.cpp context (eagle3_gguf.py), beside a llama.cpp target; one
    row (the head's context holds one sequence)."""

    supports_batch = False

    def __init__(self, path: str | Path):
        from ..backends.llamacpp import require_llama_cpp
        from .eagle3_gguf import LlamaCppEagle3Head

        require_llama_cpp()
        path = Path(path)
        if not path.is_file():
            raise DraftVerifyError(f"--eagle3 {path}: no such GGUF file")
        super().__init__(None)  # no torch head: the GGUF is the head
        self.gguf = LlamaCppEagle3Head(path)
        self._last_logits = torch.empty(0)

    @property
    def aux_layers(self) -> tuple[int, ...]:
        return self.gguf.aux_layers

    def bind(self, target: LMBackend, max_positions: int) -> None:
        if not isinstance(target, LlamaCppLayerInputs):
            raise DraftVerifyError(
                "an EAGLE-3 head given as a GGUF file runs on llama.cpp beside a llama.cpp target: use --backend "
                "llamacpp, or pass the head's folder to run it in torch"
            )
        self.target = target
        self.gguf.attach(target.target, max_positions + 1, target.target.threads)

    def start(self, state, prefilled=None) -> None:
        if state.tokens.shape[0] != 1:
            raise DraftVerifyError("eagle3 with a GGUF head drafts for one row at a time; send requests one by one")
        super().start(state, prefilled)
        self.gguf.clear()

    def _encode(self, features: torch.Tensor) -> torch.Tensor:
        return self.gguf.encode(features[0])[None]  # [1, m, H]

    def _step(
        self, tokens: torch.Tensor, g: torch.Tensor, positions: torch.Tensor, fresh: torch.Tensor
    ) -> torch.Tensor:
        prenorm, self._last_logits = self.gguf.decode(tokens[0].tolist(), g[0], int(positions[0, 0]))
        return prenorm[None, None]  # [1, 1, H]

    def _logits(self, prenorm: torch.Tensor) -> torch.Tensor:
        """The logits llama.cpp computed with the prenorm state _step last returned (the only one asked for)."""
        return self._last_logits[None]  # [1, V]

    def _truncate(self, length: int) -> None:
        self.gguf.truncate(length)

    def drop_rows(self, keep: torch.Tensor) -> None:
        raise DraftVerifyError("eagle3 with a GGUF head drafts for one row at a time")

    def join_rows(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        raise DraftVerifyError("eagle3 with a GGUF head drafts for one row at a time")


def is_gguf(path) -> bool:
    """A head given as a GGUF file (what llama.cpp's converter writes) rather than a checkpoint folder."""
    return path is not None and str(path).endswith(".gguf")


def right_aligned(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of different lengths [P_b, D] -> one block [B, max P_b, D], each row at its right end (zeros on the
    left), and the lengths [B]."""
    counts = torch.tensor([len(r) for r in rows])
    block = rows[0].new_zeros((len(rows), int(counts.max()), rows[0].shape[-1]))
    for b, r in enumerate(rows):
        if len(r):
            block[b, block.shape[1] - len(r) :] = r
    return block, counts


def join_right_aligned(
    a: torch.Tensor, a_counts: torch.Tensor, b: torch.Tensor, b_counts: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's last a_counts entries of a [B, m, D], then its last b_counts of b [B, k, D], right-aligned
    [B, w, D] (padding on the left), and the rows' counts [B]."""
    m, k = a.shape[1], b.shape[1]
    counts = a_counts + b_counts
    back = torch.arange(int(counts.max()) - 1, -1, -1, device=a.device)[None]  # [1, w] columns from the end
    index = torch.where(back < b_counts[:, None], m + k - 1 - back, m - 1 - (back - b_counts[:, None]))  # [B, w]
    both = torch.cat([a, b], dim=1)  # [B, m + k, D]
    return both.gather(1, index.clamp(0, m + k - 1)[..., None].expand(-1, -1, a.shape[2])), counts

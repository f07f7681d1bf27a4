"""The llama.cpp backend: a GGUF model scored through llama-cpp-python's low-level C API (the optional extra
`llamacpp`), behind the same protocol as CachedLM (backends/base.py), for the target or a draft model.

One llama.cpp context per model. Positions and the KV cache are llama.cpp's; this class keeps only the bookkeeping
of its uncommitted tail: each tail token's position, parent and sequence id. Below, one row (batch size 1), on one
unified KV cache (kv_unified: every sequence's cells in one pool); several rows (batches, continuous batching) each
take a sequence of their own and score chains, on a context made with a KV stream per row slot (llamacpp_rows.py).

- A chain lives in sequence 0. Scoring n tokens is one `llama_decode` with logits requested at every position;
  rolling back rejected tokens is `llama_memory_seq_rm(0, kept_end, -1)`.
- A token tree is scored in one `llama_decode` by giving each node the set of sequence ids of the branches that
  contain it (as llama.cpp's speculative example does for several drafts): branch b is sequence b, the committed
  prefix is copied to every branch's sequence first (`llama_memory_seq_cp`: with `kv_unified` the cells are shared,
  not copied), and a node's first sequence id (the one llama.cpp masks its query by) is its first branch. A query
  then sees exactly the committed prefix, its ancestors and itself. Keeping the accepted branch is
  `llama_memory_seq_rm` of the other sequences and of the branch's tail beyond the kept node, then
  `llama_memory_seq_cp` of the branch back into sequence 0.
- The prompt's prefill is deferred to the first forward (or to whatever reads the cache first: a tree, a commit, a
  rollback, `prefilled`). A chain forward decodes it with its first token alone (the prompt's P tokens in one
  `llama_decode`, as a plain loop and llama.cpp's tools decode them) and its other tokens in a second decode: the
  prompt's cells and the first logits then hold the same values whatever a method drafts, as plain decoding's do.
- The caller describes a tree as CachedLM's callers do (position ids plus an ancestor mask over the tail and the
  new tokens); the mask is read back into parents here, and anything that is not a tree is refused.

Not offered (see `check_backend`): token trees in batches of several rows, extra embedded positions (BiTA), the
hidden states and modules that the heads / early-exit / NAT drafters read, encoder-decoder models.
"""

from __future__ import annotations

import ctypes
import importlib.util
import sys
import weakref
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..errors import DraftVerifyError
from ..sampling import host_array, with_host_array
from ..types import TargetOutput
from . import LLAMACPP_INSTALL
from .base import kept_positions
from .llamacpp_ext import ext_call
from .llamacpp_kernels import (
    FLASH_ATTENTION,
    chains_exact,
    exact_kernels_setup,
    float_type_by_width,
    library,
    library_missing,
)
from .llamacpp_rows import BATCH, LlamaCppRows
from .llamacpp_ubatches import MicroBatchCost

if TYPE_CHECKING:
    from ..verifiers.base import Verifier

GGUF_TYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}  # our --dtype -> the converter's --outtype
MAX_SEQUENCES = 64  # tree branches one decode may score (llama.cpp allows up to 256)
# Sequences a one-row context holds until its first token tree: llama_decode checks the batch against every
# sequence the context holds (pairs of them, in llama_batch_allocr::init), a cost paid per decode, which a
# context of one sequence does not pay. The first tree makes the context again with max_sequences (forward)
CHAIN_SEQUENCES = 1
DEFAULT_CELLS = 4096  # KV cells a context starts with (grown on demand up to the model's context length)
MAX_LOGIT_VIEWS = 64  # views of the logits buffer kept (_logits), one per row count asked
TREE_ROOM = 256  # cells beyond the positions: a tree's siblings take cells too


class DecodeClock:
    """Seconds spent inside llama_decode by every context of this process, and the calls: what
    `draftverify bench-overhead --backend llamacpp` subtracts from a generation's wall time to find the loop's own
    (two clock reads per decode)."""

    seconds: float = 0.0
    calls: int = 0


DECODE_CLOCK = DecodeClock()


def installed() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def require_llama_cpp():
    """The low-level module, or a one-line error saying how to install the extra."""
    if not installed():
        raise DraftVerifyError(
            f"the llamacpp backend needs llama-cpp-python: {LLAMACPP_INSTALL} "
            "(it builds llama.cpp from source, about 6-8 minutes)"
        )
    try:
        import llama_cpp.llama_cpp as lib
    except FileNotFoundError as err:  # llama-cpp-python finds no libllama, its own or in $LLAMA_CPP_LIB_PATH
        raise DraftVerifyError(library_missing(err)) from None

    global _LOG
    if _LOG is None:  # llama.cpp's load and context logs: errors only (kept referenced: C holds the pointer)
        import sys

        def log(level: int, text: bytes, user_data) -> None:
            if level == 4:  # GGML_LOG_LEVEL_ERROR
                sys.stderr.write(text.decode("utf-8", "replace"))

        _LOG = lib.llama_log_callback(log)
        lib.llama_log_set(_LOG, ctypes.c_void_p(0))
    return lib


_LOG = None


_BACKEND_READY = False


def _init(lib) -> None:
    global _BACKEND_READY
    if not _BACKEND_READY:
        lib.llama_backend_init()
        _BACKEND_READY = True


def cpu_has_amx(cpuinfo: str | None = None) -> bool:
    """Whether the CPU has AMX tiles (cpuinfo: /proc/cpuinfo's text; read when None, absent off Linux).

    On such CPUs llama.cpp puts quantized weights in its AMX buffers, whose matmul crashes on small models (a
    segmentation fault in ggml_backend_amx_mul_mat on the zoo's q8_0 draft; llama.cpp issue 20824): GGUFModel then
    keeps every weight in plain CPU buffers (llama_model_params.use_extra_bufts off)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    return any(line.startswith("flags") and "amx_int8" in line.split() for line in cpuinfo.splitlines())


def first_branch_first(parents: list[int], base: int) -> list[int]:
    """New tokens' indices in depth-first order, each node's children in index order (parents: tail indices, new
    token i is base + i, below base or -1 outside the new tokens). The first branch then takes the cells right
    after the tail's, as a chain would (LlamaCppLM.rescore_branch relies on it)."""
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        children.setdefault(p - base if p >= base else -1, []).append(i)
    order: list[int] = []
    stack = list(reversed(children.get(-1, [])))
    while stack:
        i = stack.pop()
        order.append(i)
        stack.extend(reversed(children.get(i, [])))
    return order


def flash_attn_type(lib, on: bool = FLASH_ATTENTION) -> int:
    """The context parameter for flash attention on or off."""
    return lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if on else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED


@dataclass(slots=True)
class _TailToken:
    pos: int
    parent: int  # tail index of the parent, -1: the last committed position
    seq: int  # the sequence id its query is masked by (its first branch)
    children: int = 0
    token: int = -1
    rank: int = -1  # its place in the order the tail took its cells, which follow the committed ones in that order


class GGUFModel:
    """A loaded GGUF file (weights shared by every context made from it)."""

    def __init__(self, path: str | Path):
        lib = require_llama_cpp()
        _init(lib)
        path = Path(path)
        if not path.is_file():
            raise DraftVerifyError(f"no GGUF file at {path}")
        params = lib.llama_model_default_params()
        # unrepacked weights on the exact kernels' library (llamacpp_kernels.py) and on AMX CPUs (cpu_has_amx)
        unrepacked = exact_kernels_setup(library(lib)["llamafile"])
        params.use_extra_bufts = not (unrepacked or cpu_has_amx())
        self.path = path
        self.lib = lib
        self.ptr = lib.llama_model_load_from_file(str(path).encode(), params)
        if not self.ptr:
            raise DraftVerifyError(
                f"llama.cpp could not load {path} (not a GGUF model, or an architecture this "
                "llama-cpp-python build does not know)"
            )
        self.vocab = lib.llama_model_get_vocab(self.ptr)
        self.n_vocab = int(lib.llama_vocab_n_tokens(self.vocab))
        self.n_embd = int(lib.llama_model_n_embd(self.ptr))
        self.n_ctx_train = int(lib.llama_model_n_ctx_train(self.ptr))
        self.eos_token_id = int(lib.llama_vocab_eos(self.vocab))
        self.bos_token_id = int(lib.llama_vocab_bos(self.vocab))
        self.architecture = self.meta("general.architecture")

    @classmethod
    def shared(cls, path: str | Path) -> GGUFModel:
        """The file's loaded model when one is alive in this process (the same file, unchanged since), else a new
        load: pipelines and contexts over one file then share its weights (llama.cpp makes any number of contexts
        from one model) instead of each holding a copy that evicts the other's from the caches."""
        path = Path(path)
        if not path.is_file():
            raise DraftVerifyError(f"no GGUF file at {path}")
        stat = path.stat()
        key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
        model = _LOADED.get(key)
        if model is None:
            model = _LOADED[key] = cls(path)
        return model

    def vocab_fingerprint(self) -> str:
        """A hash of every token's text: two GGUF files with one fingerprint share a vocabulary."""
        import hashlib

        digest = hashlib.sha256()
        for token in range(self.n_vocab):
            digest.update(self.lib.llama_vocab_get_text(self.vocab, token) + b"\0")
        return digest.hexdigest()

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(256)
        n = self.lib.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    def file_type(self) -> str | None:
        """The file's general.file_type (llama.cpp's LLAMA_FTYPE_* as text), or for a file without it the float type
        its weights' mean width shows, None for a quantized one (llamacpp_kernels.float_type_by_width)."""
        file_type = self.meta("general.file_type")
        if file_type is not None:
            return file_type
        return float_type_by_width(
            int(self.lib.llama_model_size(self.ptr)), int(self.lib.llama_model_n_params(self.ptr))
        )

    def __del__(self, finalizing=sys.is_finalizing):  # bound now: at exit the module's `sys` may be gone already
        if getattr(self, "ptr", None) and not finalizing():  # at exit llama_cpp's functions may be gone
            self.lib.llama_model_free(self.ptr)
            self.ptr = None


_LOADED: weakref.WeakValueDictionary[tuple[str, int, int], GGUFModel] = weakref.WeakValueDictionary()


class LlamaCppLM(LlamaCppRows):
    """One GGUF model, one llama.cpp context (backends/base.py: LMBackend). Invariant between steps: the KV cache
    holds every committed token but the last, in sequence 0 only."""

    name = "llamacpp"
    is_encoder_decoder = False
    takes_positions = True  # token trees: per-node sequence-id sets
    supports_rows = True  # rows mode: a sequence per row (llamacpp_rows.py)
    rows_take_trees = False  # a token tree is one row's
    exposes_hidden = False
    has_modules = False
    computes_in_torch = False  # llama.cpp's own threads
    defers_prefill = True  # the prompt is decoded by the first forward (_flush_deferred)
    takes_host_ids = True  # a chain's tokens as Python ints: llama.cpp's batch reads them on the host
    dear_width = True  # a CPU forward's cost grows about linearly with the tokens scored (benchmarks/cost)

    def __init__(
        self,
        model: GGUFModel | str | Path,
        role: str = "target",
        threads: int | None = None,
        n_ctx: int | None = None,
        max_sequences: int = MAX_SEQUENCES,
        flash_attn: bool = FLASH_ATTENTION,
    ):
        self.model = model if isinstance(model, GGUFModel) else GGUFModel.shared(model)
        self.flash_attn = flash_attn
        lib = self.lib = self.model.lib
        # llama_get_logits answering a plain address (llama-cpp-python's binding wraps it in a ctypes pointer)
        self._logits_address = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(("llama_get_logits", lib._lib))
        # whether a chain's rows round as one-token decoding does (llamacpp_kernels.py: the kernels and the file's
        # type): only then is a kept tree branch worth re-scoring as a chain (rescore_branch)
        self.chains_exact = chains_exact(library(lib)["llamafile"], flash_attn, self.model.file_type())
        self.role = role
        self.device = torch.device("cpu")
        self.vocab_size = self.model.n_vocab
        self.max_positions = self.model.n_ctx_train or None
        self.threads = threads if threads is not None else torch.get_num_threads()
        self.max_sequences = max_sequences
        self.sequences = CHAIN_SEQUENCES  # the unified context's sequences: max_sequences from the first tree on
        self.fixed_ctx = n_ctx is not None
        # cells: the request's positions plus room for a wide tree's siblings, which take cells but no positions.
        # The context starts at most DEFAULT_CELLS + TREE_ROOM cells (a 128k-context model would otherwise allocate
        # its whole KV cache) and is made again, larger, by check_fits when a request needs more (between requests)
        self.ctx = None
        self.layer_inputs: tuple[int, ...] = ()  # layers whose inputs every decode keeps (capture_layer_inputs)
        self._layer_rows: list[torch.Tensor] = []  # [n, len(layer_inputs) * H] per decode since the last take
        self.entry_layer_inputs = torch.empty(0)  # rows mode: the last decode's, in its entries' order
        self.row_layer_inputs: tuple[torch.Tensor, list[torch.Tensor]] | None = None  # take_row_layer_inputs
        # rows on their own KV streams (llamacpp_rows.py) need a plain KV cache (a sliding-window or recurrent
        # model's memory is kept unified, as is a context whose size was given)
        self.streams = not self.fixed_ctx and not (
            lib.llama_model_n_swa(self.model.ptr) > 0
            or lib.llama_model_is_recurrent(self.model.ptr)
            or lib.llama_model_is_hybrid(self.model.ptr)
        )
        self.fit_cells = 0  # the cells the last check_fits asked one sequence for
        self.row_slots: int | None = None  # the context's KV streams (one per row slot); None: one unified cache
        self.ubatch_cost = MicroBatchCost()  # what one more micro-batch costs on this model, in tokens (rows' filler)
        self.unified_cells = (
            n_ctx if n_ctx is not None else min(self.max_positions or DEFAULT_CELLS, DEFAULT_CELLS) + TREE_ROOM
        )
        self._make_context(self.unified_cells)
        self.batch = lib.llama_batch_init(BATCH, 0, max_sequences)
        b = self.batch  # its arrays, read once: _extend_chain fills them every step
        self._batch_arrays = (b.token, b.pos, b.n_seq_id, b.seq_id, b.logits)
        self.committed = 0
        self.deferred: list[int] = []  # the committed prompt tokens not decoded yet (the last ones of committed)
        self.tail: list[_TailToken] = []
        self.live: set[int] = {0}  # sequence ids that hold cells
        self.root_children = 0
        self.chain = True  # the tail is one chain in sequence 0 (no branch yet)
        self._prefilled: TargetOutput | None = None
        self._rescored: tuple[int, list[int]] | None = None  # (m, branch) while a re-scored branch awaits commit
        self.prompt_parts: list[torch.Tensor] | None = None  # one row's kept prompt logits (start's prompt_logits)

    def _make_context(self, cells: int, slots: int | None = None) -> None:
        """A new context (the old one freed, its cells lost): one unified KV cache of `cells` cells shared by every
        sequence (slots None: one row, its token trees' branches sharing the prefix's cells), or `slots` KV streams
        of `cells` cells each, sequence s alone in stream s (rows: a row's queries attend to its own cells only)."""
        lib = self.lib
        if self.ctx:
            lib.llama_free(self.ctx)
            self.ctx = None
        params = lib.llama_context_default_params()
        params.n_ctx = cells * (slots or 1)  # llama.cpp gives each stream n_ctx / n_seq_max cells
        params.n_batch = params.n_ubatch = BATCH
        params.n_seq_max = slots or self.sequences
        params.n_threads = params.n_threads_batch = self.threads
        params.kv_unified = slots is None  # branches share the prefix's cells; rows get a stream each
        params.flash_attn_type = flash_attn_type(lib, self.flash_attn)
        params.no_perf = True
        self.ctx = lib.llama_init_from_model(self.model.ptr, params)
        self._logit_views: dict[tuple[int, int, bool], torch.Tensor] = {}  # _logits: views of this context's buffer
        self._chain_outputs: dict[tuple[int, int], TargetOutput] = {}  # _chain_output: (buffer address, width)
        if not self.ctx:
            raise DraftVerifyError(
                f"llama.cpp could not create a context of {params.n_ctx} cells for {self.model.path}"
            )
        self.row_slots = int(lib.llama_n_seq_max(self.ctx)) if slots is not None else None
        self.n_ctx_seq = int(lib.llama_n_ctx_seq(self.ctx))  # cells one sequence may hold
        if slots is None:
            self.unified_cells = cells
        self.n_ctx = int(lib.llama_n_ctx(self.ctx))
        self.memory = lib.llama_get_memory(self.ctx)
        if self.layer_inputs:
            set_layer_input = ext_call(lib, "llama_set_embeddings_layer_inp")
            for layer in self.layer_inputs:
                set_layer_input(self.ctx, layer, True)

    # ---- the protocol -----------------------------------------------------------------------------------------
    @property
    def length(self) -> int:
        if self.seqs is not None:
            return max(self.held, default=0)
        return self.committed + len(self.tail)

    def check_fits(self, decoder_positions: int) -> None:
        if self.max_positions is not None and decoder_positions > self.max_positions:
            raise DraftVerifyError(
                f"the {self.role} model attends to at most {self.max_positions} positions, but this request needs "
                f"{decoder_positions} (prompt + max_new_tokens); shorten the prompt or lower max_new_tokens"
            )
        self.fit_cells = decoder_positions + TREE_ROOM
        if self.row_slots is not None:  # on streams: the rows' streams (_make_room) or the one row's unified cache
            return  # (start) are sized for it when that request starts or joins
        if decoder_positions + TREE_ROOM > self.n_ctx:
            if self.fixed_ctx:
                raise DraftVerifyError(
                    f"the {self.role}'s llama.cpp context holds {self.n_ctx} cells (n_ctx); this "
                    f"request needs {decoder_positions} plus room for the verify width"
                )
            held = sum(self.held) if self.seqs is not None else 0  # a row joins rows that hold cells already
            self._grow(decoder_positions + TREE_ROOM + held)  # the live sequences are copied across

    def start(
        self,
        input_ids: torch.Tensor,
        want_hidden: bool = False,
        attention_mask: torch.Tensor | None = None,
        prompt_logits: bool = False,
    ) -> torch.Tensor:
        """Reset to input_ids [B, L]; all but each row's last token are deferred to the next forward (or to reading
        `prefilled`). prompt_logits: that decode keeps the logits at every prompt position (take_prompt_logits)."""
        if want_hidden:
            raise DraftVerifyError(
                "the llamacpp backend does not return hidden states; run this method on --backend hf"
            )
        self.lib.llama_memory_clear(self.memory, False)  # cells only: freed cells are masked until rewritten, so
        # zeroing the buffers too would only cost time per request
        if self.layer_inputs:  # an earlier request's extraction (capture_layer_inputs): asked for anew each request
            self._set_layer_inputs(())
        self.tail = []
        self.live = {0}
        self.root_children = 0
        self.chain = True
        self._prefilled = None
        self._rescored = None
        self.deferred = []
        self.prompt_parts = [] if prompt_logits else None
        if input_ids.shape[0] > 1 or attention_mask is not None:
            return self._start_rows(input_ids, attention_mask, prompt_logits)  # rows mode (llamacpp_rows.py)
        self.seqs = None
        if self.row_slots is not None and self.fit_cells > self.n_ctx_seq:  # stream 0 is too small: one unified
            self._make_context(max(self.unified_cells, self.fit_cells))  # cache (the next rows make streams again)
        self.deferred = input_ids[0, :-1].tolist()  # decoded by the first forward (_flush_deferred)
        self.committed = len(self.deferred)
        return input_ids

    @property
    def prefilled(self) -> TargetOutput | None:
        """Logits at the last prefilled position [B, 1, V] (None for a one-token prompt); reading it before the
        first forward decodes the deferred prompt now."""
        if self.seqs is not None:
            return self._rows_prefilled()
        self._flush_deferred()
        return self._prefilled

    def take_prompt_logits(self) -> list[torch.Tensor | None]:
        """The logits start / join_rows kept (prompt_logits=True), once, per row: [P, V] at the row's prompt
        positions but the last, None for a row whose were not kept. Decodes a prompt still deferred."""
        if self.seqs is not None:
            return self._take_rows_prompt_logits()
        self._flush_deferred()
        parts, self.prompt_parts = self.prompt_parts, None
        if parts is None:
            return [None]
        return [torch.cat(parts) if parts else torch.empty(0, self.vocab_size)]

    def forward(
        self,
        tokens: torch.Tensor | list[list[int]],
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        want_hidden: bool = False,
        new_valid: torch.Tensor | list[list[bool]] | None = None,
        logits_to_keep: int = 0,
    ) -> TargetOutput:
        """tokens [B, n] after the tail (a tensor, or Python ints: takes_host_ids); logits [B, n, V] (float32, a
        view of llama.cpp's buffer: valid until the next forward). attention_mask: bool [n, tail + n], which must
        describe a tree of one row (each token sees its parent's view and itself); None: a chain after the tail.
        new_valid [B, n] (rows mode): False at padding, which is not decoded (its logits are zeros).
        logits_to_keep k > 0: only the last min(k, n) positions are output rows of the decode [B, min(k, n), V]
        (llama.cpp runs the output layer on output rows alone)."""
        if want_hidden:
            raise DraftVerifyError(
                "the llamacpp backend does not return hidden states; run this method on --backend hf"
            )
        rows = tokens if isinstance(tokens, list) else tokens.tolist()
        valid = new_valid.bool().tolist() if isinstance(new_valid, torch.Tensor) else new_valid
        if attention_mask is not None or position_ids is not None:
            if len(rows) != 1 or self.seqs is not None:
                raise DraftVerifyError(
                    "the llamacpp backend scores token trees one row at a time; batch a chain method on it, or "
                    "run tree methods in batches on --backend hf"
                )
        elif self.seqs is not None:
            return self._forward_rows(rows, valid, logits_to_keep)
        if len(rows) != 1 or (valid is not None and not all(valid[0])):
            raise DraftVerifyError("this llamacpp backend holds one row: start() it with the batch's rows")
        ids = rows[0]
        n = len(ids)
        if n == 0:
            return TargetOutput(logits=torch.empty(1, 0, self.vocab_size))
        if n > BATCH:
            raise DraftVerifyError(f"the llamacpp backend scores at most {BATCH} tokens per forward, got {n}")
        keep = kept_positions(logits_to_keep, n)
        if attention_mask is None and position_ids is None and self.chain:  # the drafts' and chains' common case
            if self.deferred:
                return self._first_forward(ids, keep)
            self._extend_chain(ids, fill=True, logits_to_keep=keep)
            self._decode(n)
            return self._chain_output(keep)  # [1, keep, V]
        if self.row_slots is not None or self.sequences < self.max_sequences:
            # a token tree's branches take a sequence each and share the prefix's cells: one unified cache of
            # max_sequences from here on, made now with the held cells copied across (one row on the rows' streams,
            # kept between requests while it drafts chains, or a context of one sequence before its first tree)
            self.sequences = self.max_sequences
            self._grow(max(self.unified_cells, self.fit_cells))
        self._flush_deferred()  # a tree's new branches copy the prompt's cells (_assign_sequences)
        base = len(self.tail)
        parents = self._parents(n, attention_mask)  # tail indices (new tokens: base + i), -1: after the prefix
        positions = []
        for p in parents:
            positions.append(self.committed if p < 0 else self.tail[p].pos + 1 if p < base else positions[p - base] + 1)
        if position_ids is not None:
            given = position_ids.reshape(-1)[-n:].tolist()
            if given != positions:
                raise DraftVerifyError(
                    f"the llamacpp backend needs each token one position after its parent "
                    f"(expected {positions}, got {given})"
                )
        seq_sets = self._assign_sequences(parents, positions, base)
        # the new tokens in the order their cells are taken: first branch first where settling can make a tree
        # exact (rescore_branch, llamacpp_settle.py); elsewhere the caller's (any layout moves near-tie roundings
        # there, so none is better)
        order = first_branch_first(parents, base) if self.chains_exact else list(range(n))
        for rank, i in enumerate(order):
            self.tail[base + i].token, self.tail[base + i].rank = ids[i], base + rank
        self._fill([ids[i] for i in order], [positions[i] for i in order], [seq_sets[i] for i in order], [True] * n)
        self._decode(n, order)
        logits = torch.empty(n, self.vocab_size)
        logits[order] = self._logits(n)  # [n, V] back in the caller's order
        return TargetOutput(logits=logits[None, n - keep :])  # [1, keep, V]

    def cost_curve(self) -> dict[int, float]:
        """Seconds of one chain forward over k tokens on this machine {k: seconds} (llamacpp_cost.py): measured once
        per file, thread count and flash-attention setting, then read from beside the file. The length policies
        that read timings start from it (api.Pipeline)."""
        from .llamacpp_cost import cost_curve

        return cost_curve(self)

    def wrap_verifier(self, verifier: Verifier) -> Verifier:
        """The loop's verifier (backends/base.py wrap_verifier): a lossless rule that checks trees, with its greedy
        tree verdicts settled against one-token decoding (llamacpp_settle.py), where a chain's rows round as
        one-token decoding does; elsewhere a second forward would not make a verdict exact (rescore_branch), and the
        verifier is returned as it is."""
        if not (self.chains_exact and verifier.lossless and verifier.accepts_trees):
            return verifier
        from .llamacpp_settle import SettlingVerifier

        return SettlingVerifier(verifier, self.rescore_branch)

    def rescore_branch(self, kept: list[int]) -> tuple[int, torch.Tensor] | None:
        """The kept branch of a scored tree (tail offsets, root first) as one-token decoding scores it, for a verdict
        that must equal greedy decoding bit for bit. Its first m tokens took the cells right after the committed
        ones, as a chain does (first_branch_first lays the first branch out so): their logits already are a
        chain's. A later token's cell sits past masked siblings, which moves cells between the SIMD lanes of the
        attention-times-V product (llamacpp_kernels.py), so its logits, and those of every token decoded after
        it, may round differently. Returns None when the whole branch is a chain's; else the first m tokens are
        kept, the rest decoded again as a chain, and (m, their logits [1, len(kept) - m, V]); commit() then
        takes a prefix of the branch (at least m) as that chain's prefix. None too where a chain's rows do not
        round as one-token decoding does either (llamafile's kernels, flash attention): a second forward would
        not make the verdict exact there."""
        if self.seqs is not None or self.chain or not self.chains_exact:
            return None
        m = 0
        while m < len(kept) and self.tail[kept[m]].rank == m:
            m += 1
        if m == len(kept):
            return None
        tokens = [self.tail[j].token for j in kept[m:]]
        self.commit(torch.tensor(kept[:m], dtype=torch.long))
        out = self.forward([tokens])
        if self.layer_inputs:  # the tree pass's layer inputs stand for the branch (a drafter's features)
            self._layer_rows.pop()
        self._rescored = (m, list(kept))
        return m, out.logits

    def commit(self, kept: int | torch.Tensor) -> None:
        if self.seqs is not None:
            if isinstance(kept, torch.Tensor):
                raise DraftVerifyError("the llamacpp backend keeps a tree's branch for one row; rows keep chains")
            self.commit_rows(torch.full((len(self.seqs),), kept))
            return
        if isinstance(kept, int) and self.chain and not self.deferred and self._rescored is None:
            # every step's commit after a chain forward (the hot path): the cells past the kept prefix are removed
            if not 0 <= kept <= len(self.tail):
                raise DraftVerifyError(f"cannot keep {kept} positions of a {len(self.tail)}-position tail")
            if kept < len(self.tail):
                self.lib.llama_memory_seq_rm(self.memory, 0, self.committed + kept, -1)
            self.committed += kept
            self.tail = []
            self.root_children = 0
            return
        self._flush_deferred()
        if self._rescored is not None:  # the branch was decoded again as a chain (rescore_branch)
            kept = self._rescored_prefix(kept)
        if isinstance(kept, torch.Tensor):
            if kept.dim() == 2:
                if kept.shape[0] != 1:
                    raise DraftVerifyError("the llamacpp backend keeps one row")
                kept = kept[0]
            offsets = kept.tolist()
        else:
            if not 0 <= kept <= len(self.tail):
                raise DraftVerifyError(f"cannot keep {kept} positions of a {len(self.tail)}-position tail")
            offsets = list(range(kept))
        previous = -1
        for j in offsets:  # a root-to-node path of the tail
            if not 0 <= j < len(self.tail) or self.tail[j].parent != previous:
                raise DraftVerifyError(f"the kept tail offsets {offsets} are not one branch of the scored tree")
            previous = j
        if not (self.chain and len(offsets) == len(self.tail)):  # a chain kept whole leaves no cell to remove
            self._drop_unkept(offsets)
        self.live = {0}
        self.committed += len(offsets)
        self.tail = []
        self.root_children = 0
        self.chain = True

    def _drop_unkept(self, offsets: list[int]) -> None:
        """Remove every tail cell off the kept root-to-node path `offsets` (tail indices) and leave the path in
        sequence 0 alone."""
        rm, cp = self.lib.llama_memory_seq_rm, self.lib.llama_memory_seq_cp
        if not offsets:
            for s in self.live:
                rm(self.memory, s, self.committed, -1)
        else:
            last = self.tail[offsets[-1]]
            branch = last.seq
            rm(self.memory, branch, last.pos + 1, -1)  # the branch's nodes beyond the kept one
            for s in self.live:
                if s != branch:
                    rm(self.memory, s, self.committed, -1)
            if branch != 0:
                cp(self.memory, branch, 0, self.committed, -1)
        for s in self.live:
            if s != 0:
                rm(self.memory, s, -1, -1)

    def _rescored_prefix(self, kept: int | torch.Tensor) -> int:
        """The chain tail's count that keeps the tail offsets `kept` of the re-scored branch."""
        m, branch = self._rescored
        self._rescored = None
        offsets = kept.reshape(-1).tolist() if isinstance(kept, torch.Tensor) else list(range(kept))
        if len(offsets) < m or offsets != branch[: len(offsets)]:
            raise DraftVerifyError(f"the kept tail offsets {offsets} are not a prefix of the re-scored branch {branch}")
        return len(offsets) - m

    def rollback(self, length: int) -> None:
        """Drop every cached position from `length` on, settled or not (a chain in sequence 0: a staged draft's
        looked-up tokens it did not choose)."""
        if self.seqs is not None:
            raise DraftVerifyError("rollback is for one row; rows keep chains with commit_rows / truncate_rows")
        if not self.chain:
            raise DraftVerifyError("rollback needs a chain tail; a token tree is pending in the llamacpp backend")
        self._rescored = None
        self._flush_deferred()
        if not 0 <= length <= self.length:
            raise DraftVerifyError(f"cannot roll back to {length} positions of {self.length}")
        self.lib.llama_memory_seq_rm(self.memory, 0, length, -1)
        self.tail = self.tail[: max(0, length - self.committed)]
        if self.tail:
            self.tail[-1].children = 0
        else:
            self.root_children = 0
        self.committed = min(self.committed, length)

    # ---- bookkeeping ------------------------------------------------------------------------------------------
    def _first_forward(self, ids: list[int], keep: int) -> TargetOutput:
        """The first chain forward after start: the deferred prompt and ids[0] (the prompt's last token, at the
        first step) in one decode, ids[1:] in a second one; [1, keep, V].

        The prompt's P tokens go in one batch whatever a method drafts, as a plain loop and llama.cpp's own tools
        decode them: a several-row product rounds by the number of rows it is given (llamafile's tiles, the
        quantized kernels), so a prompt decoded beside a draft held other cache values than plain decoding's and a
        near tie after it parted a method's text from plain decoding's, while a prompt of P - 1 tokens with its last
        one decoded apart rounded otherwise than llama.cpp's plain decoding of the same file. So every method's
        prompt cells and first logits are plain decoding's, bit for bit."""
        n = len(ids)
        start = self._extend_chain(ids)  # the tail's bookkeeping; the batches are filled below
        head = self._flush_deferred(first=ids[0], first_output=keep == n)  # [1, V], a view (None: not kept)
        if n == 1:
            return self._chain_output(1) if self.prompt_parts is None else TargetOutput(logits=head[None])
        kept_from = n - keep  # forward's kept positions: the last `keep` of ids
        if keep == n:
            head = head.clone()  # outlives the view
        self._fill(ids[1:], list(range(start + 1, start + n)), [[0]] * (n - 1), [i >= kept_from for i in range(1, n)])
        self._decode(n - 1)
        if keep < n:
            return self._chain_output(keep)
        rest = host_array(self._logits(n - 1))
        joined = np.concatenate([head.numpy(), rest])[None]  # [1, n, V]
        return TargetOutput(logits=with_host_array(torch.from_numpy(joined), joined))

    def _flush_deferred(self, first: int | None = None, first_output: bool = True) -> torch.Tensor | None:
        """Decode the deferred prompt in chunks of at most BATCH. Without `first`, the chunk that ends it also gives
        `prefilled` (the prompt's last position). With `first` (a forward's first token, at the position after the
        prompt), that token is decoded in the prompt's last chunk, with an output row there if first_output (the
        prompt's last position has none then, as in a plain loop: `prefilled` stays None unless every position's
        logits are kept); returns its logits [1, V], a view valid until the next decode (None without one)."""
        extra = [] if first is None else [first]
        every = self.prompt_parts is not None  # every position's logits, or the last one's
        head = None
        while self.deferred:
            last = len(self.deferred) + len(extra) <= BATCH
            chunk = self.deferred if last else self.deferred[: min(BATCH, len(self.deferred) - len(extra))]
            start = self.committed - len(self.deferred)
            tokens = chunk + extra if last else chunk
            outputs = [every or (last and not extra and i == len(chunk) - 1) for i in range(len(chunk))]
            if last:
                outputs += [first_output] * len(extra)
            self._fill(tokens, list(range(start, start + len(tokens))), [[0]] * len(tokens), outputs)
            self._decode(len(tokens))
            rows = sum(outputs)
            if every:
                self.prompt_parts.append(self._logits(rows)[: len(chunk)].clone())  # outlives the view
            if last and extra:
                head = self._logits(rows)[-1:] if first_output else None
                if every:
                    self._prefilled = TargetOutput(logits=self.prompt_parts[-1][None, -1:])
            elif last:  # [1, 1, V], outlives the view
                self._prefilled = TargetOutput(logits=self._logits(rows)[None, -1:].clone())
            self.deferred = self.deferred[len(chunk) :]
        return head

    def _parents(self, n: int, mask: torch.Tensor | None) -> list[int]:
        """Each new token's parent (a tail index; new token i is base + i; -1: the committed prefix's end)."""
        base = len(self.tail)
        if mask is None:  # a chain after the tail, which must itself be a chain
            if any(t.parent != j - 1 for j, t in enumerate(self.tail)):
                raise DraftVerifyError(
                    "a token tree is pending in the llamacpp backend's tail: give the new tokens' attention mask"
                )
            return [base + i - 1 for i in range(n)]
        if mask.dim() == 3:
            mask = mask[0]
        if tuple(mask.shape) != (n, base + n):
            raise DraftVerifyError(
                f"attention mask must cover {n} new tokens x {base + n} tail + new positions, got {tuple(mask.shape)}"
            )
        rows = mask.tolist()
        parents = []
        for i, row in enumerate(rows):
            me = base + i
            seen = [j for j in range(me) if row[j]]
            if not row[me] or any(row[me + 1 :]):
                raise DraftVerifyError(
                    "the llamacpp backend scores token trees: each token sees itself and no later token"
                )
            parent = seen[-1] if seen else -1
            expected = self._ancestors(parent, parents, base)
            if seen != expected:
                raise DraftVerifyError(
                    "the attention mask is not a token tree (a token must see exactly its "
                    "ancestors); the llamacpp backend scores chains and trees only"
                )
            parents.append(parent)
        return parents

    def _extend_chain(self, ids: list[int], fill: bool = False, logits_to_keep: int = 0) -> int:
        """Tokens after a chain tail, all in sequence 0 (the bookkeeping _parents and _assign_sequences give a
        chain, without reading a mask); returns the first one's position (the rest follow it). fill: the batch is
        filled in the same pass, as _fill makes it for these tokens with logits where forward's logits_to_keep puts
        them (0: at every one; the hot path's forward: one loop over the tokens, not two)."""
        tail = self.tail
        base = len(tail)
        if base:
            tail[-1].children += 1
        else:
            self.root_children += 1
        start = self.committed + base
        last = len(ids) - 1
        if fill:
            self.batch.n_tokens = len(ids)
            token, pos, n_seq_id, seq_id, logits = self._batch_arrays
            first_output = len(ids) - kept_positions(logits_to_keep, len(ids))
            for i, t in enumerate(ids):
                tail.append(_TailToken(start + i, base + i - 1, 0, int(i < last), t, base + i))
                token[i] = t
                pos[i] = start + i
                n_seq_id[i] = 1
                seq_id[i][0] = 0
                logits[i] = i >= first_output
            return start
        for i, t in enumerate(ids):
            tail.append(_TailToken(start + i, base + i - 1, 0, int(i < last), t, base + i))
        return start

    def _parent_of(self, j: int, parents: list[int], base: int) -> int:
        return self.tail[j].parent if j < base else parents[j - base]

    def _ancestors(self, j: int, parents: list[int], base: int) -> list[int]:
        """Tail indices of j and its ancestors, in order (empty for -1)."""
        out = []
        while j >= 0:
            out.append(j)
            j = self._parent_of(j, parents, base)
        return out[::-1]

    def _assign_sequences(self, parents: list[int], positions: list[int], base: int) -> list[list[int]]:
        """Sequence ids of each new token, its own branch first; copies the prefix / tail path into new branches."""
        n = len(parents)
        seqs: list[list[int]] = [[] for _ in range(n)]
        new_tail: list[_TailToken] = []
        cp = self.lib.llama_memory_seq_cp
        for i, parent in enumerate(parents):
            if parent < 0:
                first = self.root_children == 0
                self.root_children += 1
                holder = None
            else:
                node = self.tail[parent] if parent < base else new_tail[parent - base]
                first = node.children == 0
                node.children += 1
                holder = node
            if first:
                seq = 0 if holder is None else holder.seq
            else:
                seq = self._fresh_sequence()
                self.chain = False
                # the new branch holds the prefix and the parent's path: copy what is in the cache already, and
                # add the branch to the new tokens on the path (scored in this same decode)
                j = parent
                while j >= base:  # ancestors among the new tokens
                    seqs[j - base].append(seq)
                    j = parents[j - base]
                if j < 0:
                    cp(self.memory, 0, seq, 0, self.committed)
                else:
                    anchor = self.tail[j]
                    cp(self.memory, anchor.seq, seq, 0, anchor.pos + 1)
            seqs[i].insert(0, seq)
            new_tail.append(_TailToken(pos=positions[i], parent=parent, seq=seq))
        self.tail.extend(new_tail)
        return seqs

    def _fresh_sequence(self) -> int:
        for s in range(1, self.max_sequences):
            if s not in self.live:
                self.live.add(s)
                return s
        raise DraftVerifyError(
            f"a token tree with more than {self.max_sequences} branches does not fit the llamacpp backend's sequences"
        )

    # ---- llama.cpp calls --------------------------------------------------------------------------------------
    def _fill(self, ids: list[int], positions: list[int], seq_sets: list[list[int]], outputs: list[bool]) -> None:
        b = self.batch
        b.n_tokens = len(ids)
        for i, (token, pos, seqs, out) in enumerate(zip(ids, positions, seq_sets, outputs)):
            b.token[i] = token
            b.pos[i] = pos
            b.n_seq_id[i] = len(seqs)
            row = b.seq_id[i]
            for k, s in enumerate(seqs):
                row[k] = s
            b.logits[i] = out

    def _decode(self, n: int, order: list[int] | None = None) -> None:
        """One llama_decode of the filled batch; `order`: the caller's index of each batch entry, for the layer
        inputs it keeps (handed over in the caller's order). Its seconds go on DECODE_CLOCK."""
        started = perf_counter()
        status = self.lib.llama_decode(self.ctx, self.batch)
        DECODE_CLOCK.seconds += perf_counter() - started
        DECODE_CLOCK.calls += 1
        if status != 0:
            raise DraftVerifyError(
                f"llama_decode failed on {n} tokens (status {status}) in the {self.role}'s llama.cpp context"
            )
        if self.layer_inputs:
            get_layer_input = ext_call(self.lib, "llama_get_embeddings_layer_inp")
            rows = torch.empty(n, len(self.layer_inputs), self.model.n_embd, dtype=torch.float32)  # [n, 3, H]
            for k, layer in enumerate(self.layer_inputs):
                part = torch.empty(n, self.model.n_embd, dtype=torch.float32)
                ctypes.memmove(part.data_ptr(), get_layer_input(self.ctx, layer), part.nbytes)
                rows[:, k] = part
            if order is not None:
                rows[order] = rows.clone()
            self._layer_rows.append(rows.flatten(1))

    # ---- layer inputs (the eagle3 method's wrapper reads them) ---------------------------------------------------
    def capture_layer_inputs(self, layers: tuple[int, ...]) -> None:
        """Until the next start(), every decode keeps the inputs of these layers at each of its positions (llama.cpp's
        own extraction, the one its draft-eagle3 reads); take_layer_inputs() hands them over. A request asks for
        them after its start: another method's requests on the same context do not pay for the extraction."""
        self.check_layers(layers)
        self._set_layer_inputs(tuple(layers))

    def check_layers(self, layers: tuple[int, ...]) -> int:
        """The model's layer count; DraftVerifyError when it lacks one of `layers`."""
        n_layers = int(self.lib.llama_model_n_layer(self.model.ptr))
        if not all(0 <= layer < n_layers for layer in layers):
            raise DraftVerifyError(f"the {self.role} has {n_layers} layers; cannot read the inputs of {list(layers)}")
        return n_layers

    def _set_layer_inputs(self, layers: tuple[int, ...]) -> None:
        """Extract exactly these layers' inputs from now on (none: no extraction); nothing kept from before."""
        if layers != self.layer_inputs:
            set_layer_input = ext_call(self.lib, "llama_set_embeddings_layer_inp")
            for layer in self.layer_inputs:
                set_layer_input(self.ctx, layer, False)
            for layer in layers:
                set_layer_input(self.ctx, layer, True)
            self.layer_inputs = layers
        self._layer_rows = []
        self.row_layer_inputs = None

    def take_row_layer_inputs(self) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Rows mode: the last forward's kept layer inputs at its scored columns [B, n, layers * H] (zeros at a
        row's padding), and each row's deferred prompt's, decoded with it ([P_b, layers * H], P_b may be 0)."""
        taken, self.row_layer_inputs = self.row_layer_inputs, None
        if taken is None:
            raise DraftVerifyError("no rows forward has kept layer inputs since the last take")
        return taken

    def take_layer_inputs(self) -> torch.Tensor:
        """The kept layer inputs of every position decoded since the last call, in decode order [m, layers * H]."""
        width = len(self.layer_inputs) * self.model.n_embd
        rows = torch.cat(self._layer_rows) if self._layer_rows else torch.empty(0, width)
        self._layer_rows = []
        return rows

    def _logits(self, rows: int, batch_dim: bool = False) -> torch.Tensor:
        """The last decode's logits [rows, V] (every output row, in batch order; [1, rows, V] with batch_dim) as a
        view of llama.cpp's own output buffer: nothing is allocated or copied, what a verifier reads (one argmax) is
        read in place. The view holds until this context's next decode, which writes the buffer again; a caller
        that keeps logits longer (the prefilled position, a chunked decode's parts) clones them. Views are kept per
        buffer address and shape (llama.cpp moves the buffer only when a decode asks for more outputs than it
        holds)."""
        address = self._logits_address(self.ctx)
        key = (address, rows, batch_dim)
        view = self._logit_views.get(key)
        if view is None:
            if len(self._logit_views) >= MAX_LOGIT_VIEWS:
                self._logit_views.clear()
                self._chain_outputs.clear()
            floats = ctypes.cast(address, ctypes.POINTER(ctypes.c_float))
            array = np.ctypeslib.as_array(
                floats, shape=(1, rows, self.vocab_size) if batch_dim else (rows, self.vocab_size)
            )
            view = self._logit_views[key] = with_host_array(torch.from_numpy(array), array)
        return view

    def _chain_output(self, rows: int) -> TargetOutput:
        """TargetOutput(logits=_logits(rows, batch_dim=True)), made once per buffer address and width and handed out
        again: its logits are the view, valid until the next decode as every forward's are, and nothing changes an
        output once made; the objects and calls fewer per step, which right after a decode cost what the caches
        lost."""
        key = (self._logits_address(self.ctx), rows)
        out = self._chain_outputs.get(key)
        if out is None:
            out = TargetOutput(logits=self._logits(rows, batch_dim=True))
            self._chain_outputs[key] = out  # after _logits, which may have cleared them
        return out

    def __del__(self, finalizing=sys.is_finalizing):  # bound now: at exit the module's `sys` may be gone already
        lib = getattr(self, "lib", None)
        if lib is None or finalizing():  # at exit llama_cpp's functions may be gone; the process frees all
            return
        if getattr(self, "batch", None) is not None:
            lib.llama_batch_free(self.batch)
            self.batch = None
        if getattr(self, "ctx", None):
            lib.llama_free(self.ctx)
            self.ctx = None


class GGUFTokenizer:
    """The tokenizer stored in a GGUF file, for a `.gguf` given without its Hugging Face folder: the few calls the
    pipeline makes of a Hugging Face tokenizer (encode with return_tensors="pt", decode, eos / pad ids)."""

    def __init__(self, model: GGUFModel):
        self.model = model
        self.lib = model.lib
        self.eos_token_id = model.eos_token_id if model.eos_token_id >= 0 else None
        self.bos_token_id = model.bos_token_id if model.bos_token_id >= 0 else None
        self.pad_token_id = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 8
        tokens = (ctypes.c_int32 * capacity)()
        n = self.lib.llama_tokenize(self.model.vocab, data, len(data), tokens, capacity, add_special_tokens, False)
        if n < 0:  # too small: -n is the count needed
            capacity = -n
            tokens = (ctypes.c_int32 * capacity)()
            n = self.lib.llama_tokenize(self.model.vocab, data, len(data), tokens, capacity, add_special_tokens, False)
        return list(tokens[:n])

    def __call__(self, text: str, return_tensors: str | None = None):
        from types import SimpleNamespace

        ids = self.encode(text)
        return SimpleNamespace(input_ids=torch.tensor([ids]) if return_tensors == "pt" else ids)

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        ids = [int(i) for i in (ids.tolist() if isinstance(ids, torch.Tensor) else ids)]
        if not ids:
            return ""
        array = (ctypes.c_int32 * len(ids))(*ids)
        capacity = 16 * len(ids) + 16
        while True:
            buffer = ctypes.create_string_buffer(capacity)
            n = self.lib.llama_detokenize(
                self.model.vocab, array, len(ids), buffer, capacity, skip_special_tokens, False
            )
            if n >= 0:
                return buffer.raw[:n].decode("utf-8", "replace")
            capacity = -n + 16

    def __len__(self) -> int:
        return self.model.n_vocab


def open_gguf(
    path: str | Path, dtype: str = "float32", role: str = "target", outtype: str | None = None
) -> tuple[GGUFModel, object | None]:
    """A `.gguf` file as it is, or a Hugging Face model folder converted with llama.cpp's converter at `dtype`
    (or at the converter's `outtype`, e.g. a draft's q8_0; cached on disk: backends/gguf.py). Returns the model
    and the folder's Hugging Face config (None for a .gguf)."""
    require_llama_cpp()
    path = Path(path)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise DraftVerifyError(f"no GGUF file at {path}")
        return GGUFModel.shared(path), None
    if not path.is_dir():
        raise DraftVerifyError(
            f"the {role} {str(path)!r} is neither a .gguf file nor a local model folder (the "
            "llamacpp backend converts local Hugging Face folders to GGUF)"
        )
    from transformers import AutoConfig

    from .gguf import gguf_for

    config = AutoConfig.from_pretrained(path)
    if getattr(config, "is_encoder_decoder", False):
        raise DraftVerifyError(
            f"the {role} {path.name!r} is an encoder-decoder model, which the llamacpp backend "
            "does not run; use --backend hf"
        )
    if outtype is None and dtype not in GGUF_TYPES:
        raise DraftVerifyError(f"dtype must be one of {', '.join(GGUF_TYPES)}, got {dtype!r}")
    try:
        return GGUFModel.shared(gguf_for(path, outtype or GGUF_TYPES[dtype])), config
    except DraftVerifyError as err:
        raise DraftVerifyError(
            f"the {role} cannot run on llama.cpp: {err}; run it with --backend hf, or give a .gguf "
            "file converted for it"
        ) from None

"""EAGLE-3 with the head run as its GGUF file on a llama.cpp context, beside a llama.cpp target.

The same method as drafters/eagle3.py (same pairs, positions and stops), with the head's three operations done by
llama.cpp as its own draft-eagle3 does them: the encoder pass turns the target's fused features into g
(`llama_process` ENCODE), the decoder pass feeds (token, g) pairs into the head's own KV cache and returns the
last pair's logits and prenorm state, and a rejected draft leaves the cache with `llama_memory_seq_rm`. The head
reads the target's token embedding and LM head through its context's `ctx_other`, so its GGUF (what `draftverify
export eagle3 --gguf` or llama.cpp's converter writes) holds only its own weights.

`--eagle3 FILE.gguf` picks it (eagle3 method, --backend llamacpp, one row at a time): drafters/eagle3.py's
Eagle3GgufDrafter drives this module's LlamaCppEagle3Head.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from ..backends.llamacpp_ext import PROCESS_DECODE, PROCESS_ENCODE, LlamaEmbd, ext_call
from ..errors import DraftVerifyError

HEAD_BATCH = 512  # pairs per llama.cpp call (a long prompt's catch-up goes in pieces)
ALL_OUTPUTS = 16  # a catch-up of at most this many pairs goes in one call, every pair an output (see decode)


class LlamaCppEagle3Head:
    """An EAGLE-3 GGUF loaded by llama.cpp, on a context of its own (sequence 0: one row's pairs by position)."""

    def __init__(self, path: str | Path):
        from ..backends.llamacpp import GGUFModel

        self.model = GGUFModel(path)
        if self.model.architecture != "eagle3":
            raise DraftVerifyError(
                f"{path} is a {self.model.architecture} GGUF, not an EAGLE-3 head (`draftverify export eagle3 --gguf "
                "f16` writes one)"
            )
        lib = self.lib = self.model.lib
        count = int(ext_call(lib, "llama_model_target_layer_ids_n")(self.model.ptr))
        ids = ext_call(lib, "llama_model_target_layer_ids")(self.model.ptr)
        self.aux_layers = tuple(int(ids[k]) for k in range(count))
        self.target_hidden = int(self.model.meta("eagle3.target_hidden_size") or self.model.n_embd)
        self.hidden = self.model.n_embd  # H of g and of the prenorm state
        self.ctx = None
        self.anchor = None  # a context of the target's model: what ctx_other names (its embedding and LM head)
        self.target_model = None  # that model (GGUFModel)
        self.batch = None
        self.memory = None
        self.cells = 0
        self.vocab_size = 0

    def attach(self, target, cells: int, threads: int) -> None:
        """A context for pairs at positions below `cells`, reading the token embedding and LM head of `target`
        (a LlamaCppLM); made again only when a request needs more cells or the target changes."""
        lib = self.lib
        n_layers = int(lib.llama_model_n_layer(target.model.ptr))
        if self.target_hidden != target.model.n_embd or not all(0 <= i < n_layers for i in self.aux_layers):
            raise DraftVerifyError(
                f"the EAGLE-3 GGUF {self.model.path} reads layers {list(self.aux_layers)} of a target with hidden size "
                f"{self.target_hidden}, but this target has {n_layers} layers of size {target.model.n_embd}; convert "
                "the head trained for this target"
            )
        same_target = self.anchor is not None and self.target_model is target.model
        if same_target and self.ctx is not None and cells <= self.cells:
            return
        self.close()
        params = lib.llama_context_default_params()
        params.n_ctx = params.n_batch = params.n_ubatch = 1  # the anchor decodes nothing: it names the model
        params.no_perf = True
        self.anchor = lib.llama_init_from_model(target.model.ptr, params)
        self.target_model = target.model  # held: the anchor and the head's graphs read its weights
        params = lib.llama_context_default_params()
        params.n_ctx = cells
        params.n_batch = params.n_ubatch = HEAD_BATCH
        params.n_seq_max = 1
        params.n_threads = params.n_threads_batch = threads
        params.no_perf = True
        params.ctx_other = self.anchor
        self.ctx = lib.llama_init_from_model(self.model.ptr, params) if self.anchor else None
        if not self.ctx:
            raise DraftVerifyError(f"llama.cpp could not create a context of {cells} cells for {self.model.path}")
        self.cells = int(lib.llama_n_ctx(self.ctx))
        self.memory = lib.llama_get_memory(self.ctx)
        self.vocab_size = target.model.n_vocab
        ext_call(lib, "llama_set_embeddings_nextn")(self.ctx, True, True)  # the prenorm state of output pairs
        self.batch = ext_call(lib, "llama_batch_ext_init")(self.ctx)

    def clear(self) -> None:
        self.lib.llama_memory_clear(self.memory, False)

    def truncate(self, length: int) -> None:
        """Keep the pairs at positions below `length`."""
        self.lib.llama_memory_seq_rm(self.memory, 0, length, -1)

    def encode(self, features: torch.Tensor) -> torch.Tensor:
        """The target's fused features [m, 3H'] -> g [m, H] (the head's fc, in llama.cpp)."""
        features = features.to(torch.float32).contiguous()
        m, width = features.shape
        g = torch.empty(m, self.hidden, dtype=torch.float32)
        batch, clear, set_pos = self.batch, self._call("llama_batch_ext_clear"), self._call("llama_batch_ext_set_pos")
        add_embd = self._call("llama_batch_ext_add_embd")
        after = int(self.lib.llama_memory_seq_pos_max(self.memory, 0)) + 1  # positions after the cache's
        for start in range(0, m, HEAD_BATCH):
            count = min(HEAD_BATCH, m - start)
            clear(batch)
            for j in range(count):
                row = LlamaEmbd(_row(features, start + j), 1, width)
                index = add_embd(batch, 0, row)
                set_pos(batch, index, ctypes.byref(ctypes.c_int32(after + j)))  # read by no one, but checked
            self._process(PROCESS_ENCODE, count)
            out = self._call("llama_get_embeddings_nextn")(self.ctx)
            ctypes.memmove(g[start : start + count].data_ptr(), out, count * self.hidden * 4)
        return g

    def decode(self, tokens: list[int], g: torch.Tensor, first: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed the pairs (tokens[j], g[j]) at positions first + j into the head's cache; returns the last pair's
        prenorm state [H] and logits [V].

        In a call with several pairs, llama.cpp's decoder hands out the first pairs' states and logits whichever
        are marked as outputs, so either every pair of the call is an output (a few pairs: one call) or the last
        pair goes in a call of its own (a prompt's many pairs: no logits for all of them)."""
        g = g.to(torch.float32).contiguous()  # [n, H]
        n = len(tokens)
        if n <= ALL_OUTPUTS:
            self._decode_pairs(tokens, g, first, range(n), outputs=True)
        else:
            for start in range(0, n - 1, HEAD_BATCH):
                self._decode_pairs(tokens, g, first, range(start, min(start + HEAD_BATCH, n - 1)), outputs=False)
            self._decode_pairs(tokens, g, first, range(n - 1, n), outputs=True)
        prenorm = torch.empty(self.hidden, dtype=torch.float32)
        state = self._call("llama_get_embeddings_nextn_ith")(self.ctx, -1)
        ctypes.memmove(prenorm.data_ptr(), state, prenorm.nbytes)
        logits = torch.empty(self.vocab_size, dtype=torch.float32)
        ctypes.memmove(logits.data_ptr(), self.lib.llama_get_logits_ith(self.ctx, -1), logits.nbytes)
        return prenorm, logits

    def _decode_pairs(self, tokens: list[int], g: torch.Tensor, first: int, pairs: range, outputs: bool) -> None:
        """One decoder call over the pairs (every one an output, or none)."""
        batch, set_pos = self.batch, self._call("llama_batch_ext_set_pos")
        add_token, set_embd = self._call("llama_batch_ext_add_token"), self._call("llama_batch_ext_set_embd_token")
        set_output = self._call("llama_batch_ext_set_output_logits")
        self._call("llama_batch_ext_clear")(batch)
        for j in pairs:
            index = add_token(batch, 0, tokens[j])
            set_pos(batch, index, ctypes.byref(ctypes.c_int32(first + j)))
            set_embd(batch, index, LlamaEmbd(_row(g, j), 1, self.hidden))
            if outputs:
                set_output(batch, index, True)
        self._process(PROCESS_DECODE, len(pairs))

    def _call(self, name: str):
        return ext_call(self.lib, name)

    def _process(self, kind: int, count: int) -> None:
        status = self._call("llama_process")(self.ctx, kind, self.batch)
        if status != 0:
            what = "encoder" if kind == PROCESS_ENCODE else "decoder"
            raise DraftVerifyError(f"llama.cpp's EAGLE-3 {what} pass failed on {count} pairs (status {status})")

    def close(self) -> None:
        lib = self.lib
        if self.batch:
            self._call("llama_batch_ext_free")(self.batch)
        if self.ctx:
            lib.llama_free(self.ctx)
        if self.anchor:
            lib.llama_free(self.anchor)
        self.ctx = self.anchor = self.batch = None

    def __del__(self):
        if getattr(self, "lib", None) is not None:
            self.close()


def _row(t: torch.Tensor, i: int):
    """A float pointer to row i of a contiguous float32 matrix."""
    return ctypes.cast(t.data_ptr() + i * t.shape[1] * 4, ctypes.POINTER(ctypes.c_float))

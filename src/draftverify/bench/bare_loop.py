"""The yardstick of our loop on llama.cpp: greedy decoding written as bare as Python allows over llama-cpp-python's
low-level API, on the same GGUF file and the same kind of context as the llama.cpp backend (backends/llamacpp.py).

One reused `llama_batch`; the prompt in one `llama_decode` with logits at its last position only; then one-token
decodes, each token the NumPy argmax of a view of llama.cpp's logits (nothing copied). What it spends outside
`llama_decode` is what any Python loop over this library must spend; what our loop spends beyond it is ours."""

from __future__ import annotations

from pathlib import Path
from time import perf_counter

import numpy as np

from ..backends.llamacpp import (
    BATCH,
    CHAIN_SEQUENCES,
    DEFAULT_CELLS,
    FLASH_ATTENTION,
    TREE_ROOM,
    cpu_has_amx,
    flash_attn_type,
    require_llama_cpp,
)
from ..errors import DraftVerifyError


class BareLoop:
    """Greedy decoding of one GGUF file in a bare ctypes loop; `generate` returns the new token ids and the
    seconds inside llama_decode."""

    def __init__(self, path: str | Path, threads: int, flash_attn: bool = FLASH_ATTENTION):
        lib = self.lib = require_llama_cpp()
        lib.llama_backend_init()
        model_params = lib.llama_model_default_params()
        model_params.use_extra_bufts = not cpu_has_amx()  # as GGUFModel: AMX's buffers crash on small models
        self.model = lib.llama_model_load_from_file(str(path).encode(), model_params)
        if not self.model:
            raise DraftVerifyError(f"llama.cpp could not load {path}")
        params = lib.llama_context_default_params()  # the llama.cpp backend's one-row context (_make_context)
        params.n_ctx = DEFAULT_CELLS + TREE_ROOM
        params.n_batch = params.n_ubatch = BATCH
        params.n_seq_max = CHAIN_SEQUENCES
        params.n_threads = params.n_threads_batch = threads
        params.kv_unified = True
        params.flash_attn_type = flash_attn_type(lib, flash_attn)
        params.no_perf = True
        self.ctx = lib.llama_init_from_model(self.model, params)
        if not self.ctx:
            raise DraftVerifyError(f"llama.cpp could not create a context for {path}")
        self.memory = lib.llama_get_memory(self.ctx)
        self.vocab = int(lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self.model)))
        self.batch = lib.llama_batch_init(BATCH, 0, 1)

    def generate(self, prompt: list[int], max_new_tokens: int, eos: set[int] = frozenset()) -> tuple[list[int], float]:
        """Greedy continuation of prompt (token ids, at most BATCH of them): up to max_new_tokens ids, ending at
        an eos id (kept) as our loop ends, and the seconds inside llama_decode."""
        if not 0 < len(prompt) <= BATCH:
            raise DraftVerifyError(f"the bare loop takes prompts of 1 to {BATCH} tokens, got {len(prompt)}")
        lib, batch = self.lib, self.batch
        lib.llama_memory_clear(self.memory, False)
        batch.n_tokens = len(prompt)
        for i, token in enumerate(prompt):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, i, 1, i == len(prompt) - 1
            batch.seq_id[i][0] = 0
        decoding = 0.0
        out: list[int] = []
        position = len(prompt)
        while True:
            started = perf_counter()
            if lib.llama_decode(self.ctx, batch) != 0:
                raise DraftVerifyError("llama_decode failed in the bare loop")
            decoding += perf_counter() - started
            logits = np.ctypeslib.as_array(lib.llama_get_logits_ith(self.ctx, -1), shape=(self.vocab,))
            out.append(int(logits.argmax()))
            if len(out) == max_new_tokens or out[-1] in eos:
                return out, decoding
            batch.n_tokens = 1
            batch.token[0], batch.pos[0], batch.n_seq_id[0], batch.logits[0] = out[-1], position, 1, True
            batch.seq_id[0][0] = 0
            position += 1

    def close(self) -> None:
        if self.batch is not None:
            self.lib.llama_batch_free(self.batch)
            self.batch = None
        if self.ctx:
            self.lib.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            self.lib.llama_model_free(self.model)
            self.model = None

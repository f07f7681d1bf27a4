"""The cost curve: wall time of one target forward that scores n tokens after a fixed context, per execution mode.

Tree and draft sizes are chosen from this curve: on a CPU, scoring n tokens costs far more than one (Theorem 8
assumes it costs the same), and how much more depends on how the forward is run. Each mode is measured on the
same context with a Hugging Face StaticCache (the position-indexed cache a compiled engine uses), so the only
difference is the mode: eager or `torch.compile` (fullgraph, one static graph per width n, inductor freezing:
weights folded as constants and prepacked), in float32 or bfloat16. Eager float32 scores few rows in the W @ x.T
layout as the engine does (few_row_linear); `eager-float32-gemm` is the same forward with torch's stock F.linear.
Greedy decoding in each mode is compared with float32 eager token for token, because bfloat16 (and a different kernel
order) may flip near-ties: the fast modes report their equality rate instead of assuming it.
"""

from __future__ import annotations

import contextlib
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter
from typing import Callable

import torch
from transformers import PreTrainedModel, StaticCache

from ..backends.hf.cache import cache_argument, keep_positions
from ..backends.hf.few_row_linear import few_row_linears
from ..errors import DraftVerifyError

DEFAULT_SIZES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48, 64)
MODES = ("eager-float32", "eager-float32-gemm", "eager-bfloat16", "compiled-float32", "compiled-bfloat16")
# the llama.cpp backend (the target converted to GGUF at that precision or quantization type): asked for by name,
# never by default
LLAMACPP_MODES = ("llamacpp-float32", "llamacpp-float16", "llamacpp-bfloat16", "llamacpp-q8_0", "llamacpp-q4_k_m")
REFERENCE_MODE = "eager-float32"  # the exact default every other mode is compared with


@dataclass(frozen=True)
class Mode:
    compiled: bool
    dtype: str  # float32 | bfloat16
    few_row: bool = True  # eager float32 only: few-row linears as W @ x.T (the engine's eager path)
    backend: str = "hf"  # "llamacpp": the llama.cpp backend's forward (LlamaCppForward)

    @classmethod
    def parse(cls, name: str) -> "Mode":
        if name not in MODES + LLAMACPP_MODES:
            raise DraftVerifyError(
                f"--cost-modes: unknown mode {name!r}; choose from {', '.join(MODES + LLAMACPP_MODES)}"
            )
        kind, dtype, *layout = name.split("-")
        if kind == "llamacpp":
            return cls(compiled=False, dtype=dtype, few_row=False, backend="llamacpp")
        return cls(compiled=kind == "compiled", dtype=dtype, few_row=not layout)


@dataclass
class CurvePoint:
    n: int
    seconds: list[float] = field(default_factory=list)  # one per timed repeat, after warm-up

    @property
    def median_ms(self) -> float:
        return 1000 * statistics.median(self.seconds)

    @property
    def min_ms(self) -> float:
        return 1000 * min(self.seconds)


@contextlib.contextmanager
def compile_settings(graphs: int):
    """Inductor freezing (weights as constants, prepacked for the CPU kernels), one static graph per width and
    room for all of them; the previous settings come back afterwards."""
    import torch._dynamo.config as dynamo
    import torch._inductor.config as inductor

    saved = (inductor.freezing, dynamo.recompile_limit, dynamo.automatic_dynamic_shapes)
    inductor.freezing = True
    dynamo.recompile_limit = max(dynamo.recompile_limit, graphs)
    dynamo.automatic_dynamic_shapes = False
    try:
        yield
    finally:
        inductor.freezing, dynamo.recompile_limit, dynamo.automatic_dynamic_shapes = saved


class StaticForward:
    """A model with a StaticCache: prefill eagerly, then score n tokens at any position with `step` (compiled or
    not). Writing the same positions again overwrites them, so a width can be timed repeatedly in place."""

    def __init__(self, model: PreTrainedModel, max_cache_len: int, compiled: bool, few_row: bool = True):
        self.model = model
        self.few_row = few_row and not compiled
        self.capacity = max_cache_len
        self.cache = StaticCache(config=model.config, max_cache_len=max_cache_len)
        self._forward: Callable = torch.compile(model, fullgraph=True, dynamic=False) if compiled else model

    def _call(self, forward: Callable, ids: torch.Tensor, start: int) -> torch.Tensor:
        positions = torch.arange(start, start + ids.shape[1], device=ids.device)  # [n]
        if start > 0:  # move the write position back (transformers 5 counts it in the cache, not cache_position)
            keep_positions(self.cache, start, self.capacity)
        with few_row_linears(ids.device, self.model.dtype, rows=ids.numel(), on=self.few_row):
            return forward(
                input_ids=ids,
                **{cache_argument(self.model): self.cache},
                cache_position=positions,
                position_ids=positions[None],
                use_cache=True,
            ).logits  # [1, n, V]

    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [1, L] at positions 0..L-1 into an emptied cache; eager (one prompt length is not a graph worth
        compiling). Returns the logits [1, L, V]."""
        self.cache.reset()
        return self._call(self.model, ids, 0)

    def step(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        return self._call(self._forward, ids, start)


class LlamaCppForward:
    """StaticForward's two calls on the llama.cpp backend (backends/llamacpp.py): the same target converted to GGUF
    at the mode's precision (a torch dtype's name) or quantization type (q8_0, q4_k_m); a step at a position drops
    what earlier steps left after it (llama_memory_seq_rm)."""

    def __init__(self, target: str | Path, dtype: str, threads: int | None = None):
        from ..backends.llamacpp import GGUF_TYPES, LlamaCppLM, open_gguf

        outtype = None if dtype in GGUF_TYPES else dtype  # a quantized file: converted at f32, then quantized
        self.lm = LlamaCppLM(open_gguf(target, "float32" if outtype else dtype, "target", outtype)[0], threads=threads)

    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [1, L] at positions 0..L-1; returns the logits at the last one [1, 1, V]."""
        self.lm.start(torch.cat([ids, ids.new_zeros((1, 1))], dim=1))  # all but the appended token are prefilled
        return self.lm.prefilled.logits

    def step(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        keep = start - self.lm.committed  # tail tokens before `start` stay, the rest of the tail goes
        if keep < 0 or keep > self.lm.length - self.lm.committed:
            raise DraftVerifyError(f"cannot score at position {start}: {self.lm.committed} positions are settled")
        self.lm.commit(keep)
        return self.lm.forward(ids).logits


def _synchronizer(device: torch.device) -> Callable[[], None]:
    """Waits for the device's queued work (a GPU returns before its kernels finish), so a clock read after it
    times the forward; a no-op on the CPU."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def time_widths(
    runner: StaticForward | LlamaCppForward,
    context: torch.Tensor,
    sizes: tuple[int, ...],
    warmup: int,
    repeats: int,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[CurvePoint], dict[int, float]]:
    """Per width n: `warmup` untimed calls (the first compiles), then `repeats` timed calls; all after the same
    context [1, C] and at the same positions C..C+n-1. Returns the points and the first-call seconds per n.

    Every width is warmed up before any is timed, and the timed calls go round the widths in turn: a process still
    settles in its first seconds, and timing one width after another made the first widths read slow."""
    length = context.shape[1]
    feed = context[0].flip(0)  # [C] any real tokens will do; the cost does not depend on which
    inputs = {n: feed[torch.arange(n, device=feed.device) % length][None] for n in sizes}  # [1, n] each
    done = _synchronizer(context.device)
    points, first_call = {n: CurvePoint(n) for n in sizes}, {}
    with torch.no_grad():
        runner.prefill(context)
        for n, ids in inputs.items():
            started = perf_counter()
            runner.step(ids, length)
            done()
            first_call[n] = perf_counter() - started
            for _ in range(max(0, warmup - 1)):
                runner.step(ids, length)
        for _ in range(repeats):
            for n, ids in inputs.items():
                started = perf_counter()
                runner.step(ids, length)
                done()
                points[n].seconds.append(perf_counter() - started)
    if progress is not None:
        progress(", ".join(f"n={n}: {p.median_ms:.2f} ms" for n, p in points.items()))
    return list(points.values()), first_call


def greedy_tokens(runner: StaticForward | LlamaCppForward, prompt: torch.Tensor, new_tokens: int) -> list[int]:
    """Greedy continuation of prompt [1, L]: eager prefill, then one token per `step` (the mode under test)."""
    out: list[int] = []
    with torch.no_grad():
        logits = runner.prefill(prompt)
        position = prompt.shape[1]
        for _ in range(new_tokens):
            token = int(logits[0, -1].argmax())
            out.append(token)
            if len(out) == new_tokens:
                break
            logits = runner.step(torch.tensor([[token]], device=prompt.device), position)
            position += 1
    return out


def equality(reference: list[list[int]], other: list[list[int]]) -> dict:
    """Share of prompts with identical greedy tokens, and where each first differs (None: identical)."""
    mismatch = [next((i for i, (a, b) in enumerate(zip(r, o)) if a != b), None) for r, o in zip(reference, other)]
    return {"equal_rate": sum(m is None for m in mismatch) / len(mismatch), "first_mismatch": mismatch}


def check_sizes(sizes: tuple[int, ...]) -> tuple[int, ...]:
    if not sizes or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes):
        raise DraftVerifyError(f"--cost-sizes must be integers >= 1, got {list(sizes)!r}")
    return tuple(sorted(set(sizes)))


def model_for(path: str | Path, dtype: str, device: str = "cpu") -> PreTrainedModel:
    from ..api import load_model

    model = load_model(path, dtype, role="target", device=device)
    model.eval()
    return model

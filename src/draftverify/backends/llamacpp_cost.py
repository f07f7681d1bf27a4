"""What one llama.cpp forward over k tokens costs on this machine: measured once per GGUF file, thread count and
flash-attention setting, and kept on disk beside the file (or in the GGUF cache when its folder is read-only).

The length policies that read timings (gamma auto, conf, and the token-tree sizing that reads theirs) start from
this curve instead of from nothing, so the first steps of the first request already draft wide where a wide pass
is cheap (an f32 file on a CPU: a pass of several tokens costs little more than one) and short where it is dear
(a quantized file: steep); the run's own timings then add to it (draft_length.StepCosts.seed)."""

from __future__ import annotations

import hashlib
import json
import os
import statistics
from pathlib import Path
from time import perf_counter
from typing import Any

# tokens per forward measured: every width a chain of up to 16 drafts verifies, then wider ones for trees. Every
# width, not powers of two: a quantized file's kernels take rows in tiles (llamafile's), so a width one past a
# tile can cost what the next whole tile does, a step that a line between two powers of two does not show
WIDTHS = tuple(range(1, 18)) + (24, 32)
CONTEXT = 192  # positions decoded before the measured forwards (a prompt's worth: attention is not free)
REPEATS = 5  # timed forwards per width; the median is kept
CURVE_VERSION = 2  # bumped when what is measured changes, so older files are measured again


def curve_path(lm: Any) -> Path:
    """Where this file's curve for lm's threads and flash attention is kept (lm: a LlamaCppLM, typed loosely since
    that module imports this one): beside the GGUF when its folder is writable, else in the GGUF cache. The name
    carries the file's size and modification time, so a file rewritten in place is measured again."""
    from .gguf import gguf_cache_dir

    path = Path(lm.model.path).resolve()
    stat = path.stat()
    identity = f"{path}|{stat.st_size}|{stat.st_mtime_ns}|{lm.threads}|{lm.flash_attn}|{CURVE_VERSION}"
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
    name = f"{path.name}.cost-{lm.threads}t-{'fa' if lm.flash_attn else 'nofa'}-{digest}.json"
    folder = path.parent if os.access(path.parent, os.W_OK) else gguf_cache_dir()
    return folder / name


def measure(lm: Any) -> dict[int, float]:
    """Seconds of one chain forward over k tokens after CONTEXT positions, k in WIDTHS (the median of REPEATS), on
    a scratch context of lm's model (its own cells are untouched)."""
    import torch

    cells = CONTEXT + 2 * max(WIDTHS)
    scratch = type(lm)(lm.model, role="cost probe", threads=lm.threads, n_ctx=cells, flash_attn=lm.flash_attn)
    vocab = lm.vocab_size
    ids = [(7 + 31 * i) % vocab for i in range(CONTEXT + max(WIDTHS) + 1)]
    scratch.start(torch.tensor([ids[:CONTEXT]]))
    scratch.forward([[ids[CONTEXT]]])  # decodes the context with it
    scratch.commit(1)
    base = scratch.length
    curve: dict[int, float] = {}
    for k in WIDTHS:
        tokens = [ids[CONTEXT + 1 : CONTEXT + 1 + k]]
        seconds = []
        for _ in range(REPEATS + 1):  # the first forward of a width allocates: not timed
            started = perf_counter()
            scratch.forward(tokens)
            seconds.append(perf_counter() - started)
            scratch.rollback(base)
        curve[k] = statistics.median(seconds[1:])
    return curve


def cost_curve(lm: Any) -> dict[int, float]:
    """lm's cost curve {tokens: seconds}, read from its file (curve_path) or measured now and written there."""
    path = curve_path(lm)
    try:
        kept = json.loads(path.read_text())
        curve = {int(k): float(v) for k, v in kept["seconds"].items()}
        if set(curve) == set(WIDTHS) and all(v > 0 for v in curve.values()):
            return curve
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass  # none yet, or unreadable: measured again
    curve = measure(lm)
    record = {"file": Path(lm.model.path).name, "threads": lm.threads, "flash_attn": lm.flash_attn, "context": CONTEXT}
    record["seconds"] = {str(k): v for k, v in curve.items()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(record, indent=1))
        temporary.replace(path)
    except OSError:
        pass  # nowhere to keep it: this process uses it, the next measures again
    return curve

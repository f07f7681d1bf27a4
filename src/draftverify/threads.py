"""torch's intra-op threads around a generation whose models compute elsewhere (llama.cpp)."""

from __future__ import annotations

import functools
from contextlib import contextmanager
from typing import Callable, Iterator

import torch

from .backends.base import computes_in_torch


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """torch.set_num_threads(threads) inside the block, the caller's setting restored after (None: unchanged)."""
    before = torch.get_num_threads()
    if threads is None or threads == before:
        yield
        return
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def one_torch_thread_unless_models_use_it(generate: Callable) -> Callable:
    """Run generate(target, drafter, ...) on one torch thread when neither the target nor the drafter computes in
    torch. The loop's own tensor ops are then small (a softmax and an argmax over the vocabulary), and a second
    torch thread only has to wait for a core that llama.cpp's workers or a neighbour process hold: nothing to gain
    on an idle machine, and a wait avoided beside a busy process."""

    @functools.wraps(generate)
    def wrapper(target, drafter, *args, **kwargs):
        elsewhere = not computes_in_torch(target) and not drafter.computes_in_torch
        with torch_threads(1 if elsewhere else None):
            return generate(target, drafter, *args, **kwargs)

    return wrapper

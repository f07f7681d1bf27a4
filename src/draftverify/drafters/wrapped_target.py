"""The target as a method wraps it (as Medusa's MedusaModel and EAGLE's EaModel wrap theirs): the wrapper changes
what it must (EAGLE-3's hidden states, BiTA's extra positions) and the decoding loop sees a backend like any other."""

from __future__ import annotations

from ..backends.base import LMBackend


class WrappedTarget:
    """Whatever the wrapper does not define is the wrapped target's own (attributes and methods alike)."""

    def __init__(self, target: LMBackend):
        self.target = target

    def __getattr__(self, name: str):
        if name == "target":  # not set yet (a copy being built): no recursion through the line below
            raise AttributeError(name)
        return getattr(self.target, name)

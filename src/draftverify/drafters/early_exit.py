"""BiLD's early-exit small model (section 4.4): the target's first L layers plus its own final norm and LM head.

The view shares every weight with the target (no copy); it keeps its own KV cache for its L layers. The target's
backend builds it (ModuleBackend.first_layers; the hf backend's is backends/hf/shallow_view.py).
"""

from __future__ import annotations

from torch import nn

from ..backends.base import LMBackend, require_modules
from ..backends.registry import as_backend
from .model import ModelDrafter


class EarlyExitDrafter(ModelDrafter):
    """A ModelDrafter whose model is a shallow view of the target; fallback (alpha_FB) works the same way."""

    needs_target_modules = "the target's own layers (the early-exit draft shares them)"

    def __init__(
        self, target: LMBackend | nn.Module, num_layers: int = 1, fallback_threshold: float = 0.0, compile: bool = False
    ):
        """target: its backend, or a Hugging Face model (put on the hf backend to build the view)."""
        modules = require_modules(as_backend(target, "target"), "early_exit")
        super().__init__(modules.first_layers(num_layers, "early-exit draft", compile), fallback_threshold)
        self.num_layers = num_layers

    @classmethod
    def from_options(cls, target: LMBackend, options) -> "EarlyExitDrafter":
        return cls(target, options.early_exit_layers, fallback_threshold=options.alpha_fb, compile=options.compile)

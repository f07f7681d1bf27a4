"""draftverify: draft cheaply, verify with the target in one forward pass.

    from draftverify import generate, load

Names are imported on first use (PEP 562), so `import draftverify` and the CLI's --help, --version, `methods`
and argument errors do not wait seconds for torch and transformers. The methods (each with its drafter class) are
registered by importing draftverify.options, the verifiers by importing draftverify.verifiers; the first name
taken from here imports both.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "CachedLM": ".backends.hf.cached_lm",
    "Draft": ".types",
    "DraftVerifyError": ".errors",
    "GenerationOutput": ".types",
    "GenerationStats": ".types",
    "Logprobs": ".types",
    "Pipeline": ".api",
    "Processing": ".processing",
    "RowRequest": ".types",
    "SamplingParams": ".types",
    "Structured": ".processing",
    "Verdict": ".types",
    "generate": ".loop",
    "load": ".api",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'draftverify' has no attribute {name!r}")
    importlib.import_module(".options", __name__)  # every public entry point expects the registries filled
    importlib.import_module(".verifiers", __name__)
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)

"""Target backends: what scores tokens for the loop (base.py: the protocol). `hf` is cached_lm.CachedLM;
`llamacpp` is llamacpp.LlamaCppLM (llama.cpp through llama-cpp-python, the optional extra `llamacpp`).

Nothing heavy is imported here: the GGUF conversion runs `python -m draftverify.backends.gguf` in a child.
"""
from __future__ import annotations

BACKENDS = ("hf", "llamacpp")
LLAMACPP_INSTALL = 'pip install -e ".[llamacpp]"'


def check_backend_name(name: str) -> str:
    from ..errors import DraftVerifyError

    if name not in BACKENDS:
        raise DraftVerifyError(f"unknown backend {name!r}; choose one of: {', '.join(BACKENDS)}")
    return name

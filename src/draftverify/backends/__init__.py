"""Target backends: what scores tokens for the loop (base.py: the protocol; registry.py: the backends by name).
`hf` is hf/cached_lm.CachedLM (the Hugging Face backend: its cache edits, rows layout, compiled widths, deep
prompts, shallow views and few-row linears are the other modules of hf/); `llamacpp` is llamacpp.LlamaCppLM
(llama.cpp through llama-cpp-python, the optional extra `llamacpp`); `lean` runs draft models only (lean_draft.py).

Nothing heavy is imported here: the GGUF conversion runs `python -m draftverify.backends.gguf` in a child.
"""

from __future__ import annotations

LLAMACPP_INSTALL = 'pip install -e ".[llamacpp]"'
# a draft model's GGUF type on the llamacpp backend (llama.cpp's converter --outtype). Its precision changes which
# tokens it proposes, never the output (the target verifies each one), so a draft defaults to 8-bit weights: a
# one-token forward waits on reading the weights, and 8-bit weights are a quarter of float32's
# q4_k_m, q4_0, q5_k_m, q6_k: made by llama-quantize from the f32 file (gguf.QUANTIZE_TYPES)
DRAFT_GGUF_TYPES = ("q8_0", "q4_k_m", "q4_0", "q5_k_m", "q6_k", "f32", "f16", "bf16")
DEFAULT_DRAFT_GGUF = "q8_0"


def check_draft_gguf(value: object) -> str:
    """A draft GGUF type, or a one-line error naming the choices."""
    return check_gguf_type(value, "--draft-gguf", "draft")


def check_gguf_type(value: object, flag: str, role: str) -> str:
    """A GGUF type the converter writes (DRAFT_GGUF_TYPES, for a target too: --target-gguf), or a one-line error."""
    from ..errors import DraftVerifyError

    if value not in DRAFT_GGUF_TYPES:
        raise DraftVerifyError(
            f"the {role}'s GGUF type ({flag}) must be one of {', '.join(DRAFT_GGUF_TYPES)}, got {value!r}"
        )
    return value

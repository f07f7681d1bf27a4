"""The runner families the bench knows, derived from the method registry (methods.py imports no model stack)."""

from __future__ import annotations

from ..methods import METHODS, Method

ALIGNED_SUFFIX = "_aligned"
GGUF_SUFFIX = "_gguf"  # a method whose piece also runs as its GGUF file in llama.cpp (registry: gguf_option)
BASELINE_DRAFTER = "none"  # the registry's drafter for plain decoding in our loop
# which rows a run has: the two baselines always run; ours come from the method registry
BASELINES = ("hf_generate", "ours_autoregressive")
PEER_FAMILIES = ("hf_assisted", "hf_prompt_lookup", "llamacpp", "llamacpp_prompt_lookup", "llamacpp_draft")


def drafting_methods() -> dict[str, Method]:
    return {name: m for name, m in METHODS.items() if m.drafter != BASELINE_DRAFTER}


def family_names() -> tuple[str, ...]:
    """Every family --runners may name: each drafting method, its aligned-draft twin, and its GGUF twin where its
    piece runs in llama.cpp."""
    methods = drafting_methods()
    names = list(methods)
    ggufs = [n + GGUF_SUFFIX for n, m in methods.items() if m.gguf_option]
    return tuple(names + [n + ALIGNED_SUFFIX for n in names] + ggufs)


def families() -> tuple[str, ...]:
    """Every runner family: baselines, peers, and each registered method (+ its `_aligned` and `_gguf` twins)."""
    return BASELINES + PEER_FAMILIES + family_names()

"""Named methods: a drafter plus a verifier, each built from one MethodOptions bag.

`exact` picks the lossless verifier for the sampling settings and the draft's shape: greedy at temperature 0,
speculative sampling otherwise, and their tree versions for tree drafts (verifiers/exact.py). Adding a method is
a new line here, never a branch in the loop.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from transformers import PreTrainedModel

from .cached_lm import CachedLM
from . import drafters as _drafters, verifiers as _verifiers  # noqa: F401  (fill the registries)
from .drafters.base import Drafter
from .errors import DraftVerifyError
from .registry import DRAFTERS, VERIFIERS, lookup
from .types import SamplingParams
from .verifiers.base import Verifier
from .verifiers.exact import ExactVerifier


@dataclass(frozen=True)
class Method:
    drafter: str
    verifier: str  # a registered verifier name, or "exact"
    summary: str


METHODS: dict[str, Method] = {
    "autoregressive": Method("none", "exact", "the target alone in our loop (no drafting): the baseline"),
    "model": Method("model", "exact", "speculative decoding with a small draft model (Leviathan et al.)"),
    "prompt_lookup": Method("prompt_lookup", "exact", "copy the continuation of the latest matching n-gram in the context"),
    "ngram": Method("ngram", "exact", "a negligible-cost n-gram table drafts (works under sampling too)"),
    "early_exit": Method("early_exit", "exact", "the target's first L layers + its LM head draft (shared weights)"),
    "model_tree": Method("model_tree", "exact", "the draft model's top-k expansion as a static token tree, verified at once"),
    "prompt_lookup_tree": Method("prompt_lookup_tree", "exact", "several earlier matches of the last n-gram, merged into one tree"),
    "bpd": Method("bpd", "exact", "blockwise parallel decoding: heads on the target's hidden state draft in its verify pass"),
    "bpd_ngram": Method("bpd_ngram", "exact", "bpd with the heads' top-k lattice rescored by an n-gram table (best path)"),
    "bpd_pbest": Method("bpd_pbest", "exact", "bpd's p best n-gram-rescored lattice paths merged into one token tree"),
    "bild": Method("model", "bild", "Big Little Decoder: fallback (alpha_FB) + rollback (alpha_RB); not lossless"),
    "bild_early_exit": Method("early_exit", "bild", "BiLD with the early-exit small model (BiLD section 4.4)"),
    "specdec++": Method("model", "topbeta", "SpecDec++ top-beta / tolerance-tau verification; not lossless"),
}


@dataclass
class MethodOptions:
    """Everything any drafter or verifier may need; each reads only its own fields."""

    draft_model: PreTrainedModel | None = None
    ngram_path: str | Path | None = None
    heads_path: str | Path | None = None  # bpd*: folder of trained blockwise heads (heads.json + heads.safetensors)
    lattice_k: int = 4  # bpd_ngram / bpd_pbest: candidates per head in the top-k lattice
    ngram_weight: float = 0.5  # alpha: weight of the n-gram score against the heads' log-probs
    pbest: int = 4  # bpd_pbest: rescored paths merged into the verified tree
    early_exit_layers: int = 1
    prompt_lookup_max_ngram: int = 3
    prompt_lookup_min_ngram: int = 1
    prompt_lookup_matches: int = 4  # prompt_lookup_tree: continuations merged into one tree
    tree_paths: list[tuple[int, ...]] | None = None  # model_tree: Medusa-style paths (None = the drafter's default)
    compile: bool = False  # draft models: preallocated cache + torch.compile, like the target's --compile
    alpha_fb: float = 0.0  # BiLD fallback threshold (0 = never fall back)
    alpha_rb: float = 2.0  # BiLD rollback threshold on -log p_target(x)
    lenience: float = 1.0
    beta: int = 3
    tau: float = 1.0


def resolve_method(name: str) -> Method:
    try:
        return METHODS[name]
    except KeyError:
        raise DraftVerifyError(f"unknown method {name!r}; choose one of: {', '.join(METHODS)}") from None


def build_drafter(name: str, target: CachedLM, options: MethodOptions) -> Drafter:
    return lookup(DRAFTERS, "drafter", name).from_options(target, options)


def build_verifier(name: str, params: SamplingParams, options: MethodOptions) -> Verifier:
    if name == "exact":
        return ExactVerifier(params, options.lenience)
    return lookup(VERIFIERS, "verifier", name).from_options(options)

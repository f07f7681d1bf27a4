"""Named methods: a drafter plus a verifier, each built from one MethodOptions (the declared options, options/).

`exact` picks the lossless verifier for the sampling settings and the draft's shape (verifiers/exact.py): greedy
at temperature 0, Gumbel-max coupling when sampling is coupled (seeded, by default: the text is then the same for
every method and draft length), speculative sampling otherwise, and their tree versions for tree drafts. Adding a
method is a new line here, never a branch in the loop.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import DraftVerifyError
from .options import MethodOptions  # the union of the declared options (options/)

if TYPE_CHECKING:  # the table is read by `draftverify methods` and argument checks, which must not wait for torch
    from .backends.base import LMBackend
    from .drafters.base import Drafter
    from .types import SamplingParams
    from .verifiers.base import Verifier


@dataclass(frozen=True)
class Method:
    drafter: str
    verifier: str  # a registered verifier name, or "exact"
    summary: str
    needs_draft: bool = False  # the drafter runs a separate draft model (draft=... / --draft)


METHODS: dict[str, Method] = {
    "autoregressive": Method("none", "exact", "the target alone in our loop (no drafting): the baseline"),
    "model": Method("model", "exact", "speculative decoding with a small draft model (Leviathan et al.); a draft "
                    "with another tokenizer runs as cross_tokenizer", True),
    "cross_tokenizer": Method("cross_tokenizer", "exact", "a draft model with its own tokenizer: its text re-tokenized "
                              "into target tokens, a deterministic proposal (universal assisted generation)", True),
    "prompt_lookup": Method("prompt_lookup", "exact", "copy the continuation of the latest matching n-gram in the context"),
    "lookup_model": Method("lookup_model", "exact", "copy from the context when its last n-gram recurs, else the draft "
                           "model drafts (the code zoo's default)", True),
    "ngram": Method("ngram", "exact", "a negligible-cost n-gram table drafts (works under sampling too)"),
    "early_exit": Method("early_exit", "exact", "the target's first L layers + its LM head draft (shared weights)"),
    "model_tree": Method("model_tree", "exact", "the draft model's top-k expansion as a static token tree, verified at once", True),
    "prompt_lookup_tree": Method("prompt_lookup_tree", "exact", "several earlier matches of the last n-gram, merged into one tree"),
    "bpd": Method("bpd", "exact", "blockwise parallel decoding: heads on the target's hidden state draft in its verify pass"),
    "bpd_ngram": Method("bpd_ngram", "exact", "bpd with the heads' top-k lattice rescored by an n-gram table (best path)"),
    "bpd_neural": Method("bpd_neural", "exact", "bpd with each head's top-k rescored left to right by the draft model "
                         "(local neural rescoring)", True),
    "bpd_pbest": Method("bpd_pbest", "exact", "bpd's p best n-gram-rescored lattice paths merged into one token tree"),
    "bita": Method("bita", "exact", "BiTA: learned mask tokens on the frozen target draft an efficient top-k tree in its verify pass"),
    "bita_tree": Method("bita_tree", "exact", "BiTA with the full top-k tree (k + k^2 + ... + k^M candidates)"),
    "bita_chain": Method("bita_chain", "exact", "BiTA's straightforward decoding: the previous pass's mask tokens' top-1 chain"),
    "bild": Method("model", "bild", "Big Little Decoder: fallback (alpha_FB) + rollback (alpha_RB); not lossless", True),
    "bild_early_exit": Method("early_exit", "bild", "BiLD with the early-exit small model (BiLD section 4.4)"),
    "specdec++": Method("model", "topbeta", "SpecDec++ top-beta / tolerance-tau verification; not lossless", True),
    "specdec": Method("nat", "exact", "SpecDec: a non-autoregressive drafter fills k mask slots in one pass "
                      "(over the encoder states, or a decoder-only target's own hidden states); needs a trained "
                      "NAT drafter (--nat; the code and translate zoos ship one, `draftverify train nat` makes one)"),
    "specdec++_nat": Method("nat", "topbeta", "SpecDec++ as in the paper: the NAT drafter under top-beta / tau; "
                            "not lossless; needs a NAT drafter like specdec"),
}


def resolve_method(name: str) -> Method:
    try:
        return METHODS[name]
    except KeyError:
        raise DraftVerifyError(f"unknown method {name!r}; choose one of: {', '.join(METHODS)}") from None


def build_drafter(name: str, target: LMBackend, options: MethodOptions) -> Drafter:
    from . import drafters  # noqa: F401  (fills the registry)
    from .registry import DRAFTERS, lookup

    return lookup(DRAFTERS, "drafter", name).from_options(target, options)


def build_verifier(name: str, params: SamplingParams, options: MethodOptions) -> Verifier:
    from . import verifiers  # noqa: F401  (fills the registry)
    from .registry import VERIFIERS, lookup

    if name == "exact":
        from .verifiers.exact import ExactVerifier

        return ExactVerifier(params, options.lenience)
    return lookup(VERIFIERS, "verifier", name).from_options(options)

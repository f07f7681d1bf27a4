"""Named methods: a drafter plus a verifier, each built from one MethodOptions (the declared options, options/).

Each drafter declares its class, options and methods in one register_methods call (registry.py; the built-in
declarations are draftverify/options/<family>.py, plug-ins come from entry points); this module is where the
rest of the package reads the result. `exact` picks the lossless verifier for the sampling settings and the
draft's shape (verifiers/exact.py): greedy at temperature 0, Gumbel-max coupling when sampling is coupled
(seeded, by default: the text is then the same for every method and draft length), speculative sampling
otherwise, and their tree versions for tree drafts.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from .errors import DraftVerifyError
from .options import (
    MethodOptions,  # the union of the declared options; importing it registers every method
)
from .registry import METHODS, Method

if TYPE_CHECKING:  # the table is read by `draftverify methods` and argument checks, which must not wait for torch
    from .backends.base import LMBackend
    from .drafters.base import Drafter
    from .types import SamplingParams
    from .verifiers.base import Verifier

__all__ = [
    "METHODS",
    "Method",
    "MethodOptions",
    "build_drafter",
    "build_verifier",
    "registered_methods",
    "resolve_method",
]


def registered_methods() -> list[Method]:
    """Every registered method, named, in registration order (what a registry-driven test iterates)."""
    return [m if m.name == name else replace(m, name=name) for name, m in METHODS.items()]


def resolve_method(name: str) -> Method:
    try:
        return METHODS[name]
    except KeyError:
        raise DraftVerifyError(f"unknown method {name!r}; choose one of: {', '.join(METHODS)}") from None


def build_drafter(name: str, target: LMBackend, options: MethodOptions) -> Drafter:
    from .registry import DRAFTERS, lookup

    return lookup(DRAFTERS, "drafter", name).from_options(target, options)


def build_verifier(name: str, params: SamplingParams, options: MethodOptions) -> Verifier:
    from . import verifiers  # noqa: F401  (fills the registry)
    from .registry import VERIFIERS, lookup

    if name == "exact":
        from .verifiers.exact import ExactVerifier

        return ExactVerifier(params, options.lenience)
    return lookup(VERIFIERS, "verifier", name).from_options(options)

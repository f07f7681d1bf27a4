"""Per-request speculative settings: which methods a server can run with what it loaded, and a request's
`speculative` field checked against them.

A server loads one target (and maybe a draft model) for its --method; every other registered method whose pieces
are loaded runs on the same models: a Pipeline per method, built once, sharing the target backend and the draft
(the worker runs one batch at a time, so they never decode at once). A method that needs a piece the server did
not load (a draft model, trained heads, an n-gram table) fails to build and is not offered. Only lossless methods
are offered besides the server's own: a request may change the speed, never the text a greedy request gets.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..draft_length import MAX_GAMMA, parse_gamma
from ..errors import DraftVerifyError
from .protocol import GAMMA_NAMES, ApiError, Speculative

AUTOREGRESSIVE = "autoregressive"  # the target alone: what `enabled: false` runs


def context_window(pipe) -> int | None:
    """Decoder positions a request may use: the target's limit, and those of the draft models the drafter calls."""
    limits = [pipe.target.max_positions] + [model.lm.max_positions for model in pipe.drafter.models()]
    limits = [x for x in limits if x is not None]
    return min(limits) if limits else None


def runnable_methods(pipe) -> dict[str, object]:
    """method name -> the Pipeline that runs it on `pipe`'s models: `pipe` itself for its own method, and every
    other lossless registered method that builds from what `pipe` loaded. A compiled pipeline runs only its own
    (its compiled target is planned for that method's verify widths). A stand-in pipeline (tests) runs its own."""
    from ..api import Pipeline
    from ..methods import registered_methods

    own = pipe.method.name
    methods = {own: pipe}
    if not isinstance(pipe, Pipeline) or pipe.compiled:
        return methods
    for method in registered_methods():
        if method.name == own or not method.lossless:
            continue
        try:
            methods[method.name] = Pipeline(
                pipe.target, pipe.tokenizer, method.name, None, pipe.options, pipe.gamma, heal=pipe.heal
            )
        except DraftVerifyError:  # a piece this server did not load (draft model, heads, table, adapter)
            continue
    return methods


@dataclass(frozen=True)
class Speculation:
    """What a request runs: a method the server offers and its draft length (as parse_gamma accepts it)."""

    method: str
    gamma: int | str


class Methods:
    """The methods a server offers and its defaults; turns a request's `speculative` field into a Speculation,
    or a 400 naming the field and what is allowed."""

    def __init__(self, pipes: dict[str, object], default_method: str, default_gamma: int | str):
        self.pipes = pipes
        self.default = Speculation(default_method, default_gamma)
        self.windows = {name: context_window(p) for name, p in pipes.items()}

    @property
    def names(self) -> list[str]:
        return list(self.pipes)

    @property
    def longest_gamma(self) -> int:
        """The longest integer gamma some method takes: MAX_GAMMA, or less where a context leaves less room (one
        position for the prompt, as parse_gamma counts)."""
        return max(MAX_GAMMA if w is None else min(MAX_GAMMA, w - 1) for w in self.windows.values())

    def resolve(self, spec: Speculative | None) -> Speculation:
        if spec is None:
            return self.default
        method = self.default.method if spec.method is None else spec.method
        if method not in self.pipes:
            raise ApiError(
                400,
                f"speculative.method {method!r} is not one this server runs; it runs: {', '.join(self.names)} "
                "(the methods whose pieces it loaded)",
                param="speculative.method",
            )
        gamma = self.default.gamma if spec.gamma is None else self.check_gamma(spec.gamma, method)
        if not spec.enabled or method == AUTOREGRESSIVE:  # nothing is drafted: one setting for every such request
            if AUTOREGRESSIVE not in self.pipes:
                raise ApiError(
                    400,
                    f"speculative.enabled: this server runs only {', '.join(self.names)} (compiled for it)",
                    param="speculative.enabled",
                )
            return Speculation(AUTOREGRESSIVE, self.default.gamma)
        return Speculation(method, gamma)

    def check_gamma(self, gamma: int | str, method: str) -> int | str:
        if isinstance(gamma, str) and not re.fullmatch(GAMMA_NAMES, gamma):  # what the schema's pattern says
            raise ApiError(
                400,
                f"speculative.gamma must be an integer or one of 'auto', 'heuristic', 'conf', 'conf=T' (T in 0..1), "
                f"got {gamma!r}",
                param="speculative.gamma",
            )
        try:
            return parse_gamma(gamma, self.windows[method])
        except DraftVerifyError as err:
            raise ApiError(400, f"speculative.{err}", param="speculative.gamma") from None

"""The CLI's help texts that speak of methods, built from the declarations the code runs (registry.py via
methods.METHODS), so a list in --help cannot drift from what batches or takes a draft; and flag(), typer.Option
with its help escaped, because typer renders help as rich markup, which would eat `.[llamacpp]` or `[auto]`.
No torch import: --help reads this."""

from __future__ import annotations

from typing import Any, Callable

import typer
from rich.markup import escape

from .methods import METHODS, Method


def flag(default: Any, *names: str, help: str | None = None, **settings: Any) -> Any:
    """typer.Option whose help is shown as written (rich markup escaped)."""
    return typer.Option(default, *names, help=escape(help) if help is not None else None, **settings)


def methods_where(test: Callable[[Method], bool]) -> str:
    """The registered methods for which test(method) holds, as a comma list in registration order."""
    return ", ".join(name for name, m in METHODS.items() if test(m))


def draft_methods() -> str:
    return methods_where(lambda m: m.needs_draft)


def one_row_methods() -> str:
    """The methods that decode one row at a time (their drafter or verifier does not batch)."""
    return methods_where(lambda m: not m.batches)


def batching_note() -> str:
    return (
        f"Every method batches except {one_row_methods()} (a model draft with its own tokenizer runs as "
        "cross_tokenizer)."
    )

"""Name -> class registries, so the loop and the CLI never grow an `if method ==` chain."""
from __future__ import annotations

from typing import Callable, TypeVar

from .errors import DraftVerifyError

T = TypeVar("T")

DRAFTERS: dict[str, type] = {}
VERIFIERS: dict[str, type] = {}
# drafter name -> the options classes it reads (draftverify.options declares them; no torch import, so the CLI can
# build its flags from them)
DRAFTER_OPTIONS: dict[str, tuple[type, ...]] = {}


def _register(table: dict[str, type], kind: str, name: str) -> Callable[[type[T]], type[T]]:
    def decorator(cls: type[T]) -> type[T]:
        if name in table:
            raise RuntimeError(f"{kind} {name!r} registered twice")
        table[name] = cls
        cls.name = name
        return cls

    return decorator


def register_drafter(name: str):
    return _register(DRAFTERS, "drafter", name)


def register_options(drafter: str, *classes: type) -> None:
    """Drafter `drafter` reads the fields of these options classes (see draftverify.options)."""
    if drafter in DRAFTER_OPTIONS:
        raise RuntimeError(f"options of drafter {drafter!r} registered twice")
    DRAFTER_OPTIONS[drafter] = classes


def register_verifier(name: str):
    return _register(VERIFIERS, "verifier", name)


def lookup(table: dict[str, type], kind: str, name: str) -> type:
    try:
        return table[name]
    except KeyError:
        raise DraftVerifyError(f"unknown {kind} {name!r}; choose one of: {', '.join(sorted(table))}") from None

"""Checks of a method's options before any model loads, read from the declarations: a zoo entry that lacks a file
the method's drafter needs, and options given that the method does not read."""

from __future__ import annotations

from typing import Any

from ..errors import DraftVerifyError
from ..methods import METHODS, resolve_method
from ..zoo import shipped, zoo_root
from .declare import Option, declaration, default_of
from .union import all_fields, drafter_fields, drafters_reading


def methods_reading(name: str) -> list[str]:
    """The methods whose drafter reads declared field `name`."""
    drafters = set(drafters_reading(name))
    return [m for m, spec in METHODS.items() if spec.drafter in drafters]


def missing_file_advice(name: str, opt: Option, zoo: str | None) -> str:
    """What to do when a needed file is missing: the declaration's own advice, else where one ships and the flag."""
    if opt.advice is not None:
        return opt.advice(zoo)
    assert opt.zoo is not None  # only a zoo-filled field misses a file
    return f"{shipped(opt.zoo)}; pass {opt.flag} PATH (API: {name}=PATH), or use another method"


def check_zoo_ships(zoo: str, method: str, values: dict[str, Any]) -> None:
    """On zoo entry `zoo`, the method's drafter needs each of its zoo-filled fields: one given, or the entry's file.
    Missing: a DraftVerifyError naming the file, which entries ship one and what to do, before any model loads."""
    folder = zoo_root() / zoo
    if not folder.is_dir():
        return  # zoo_folder says what is wrong with the name
    for f, opt in drafter_fields(resolve_method(method).drafter):
        if opt.zoo is not None and values.get(f.name) is None and not (folder / opt.zoo).exists():
            users = " / ".join(methods_reading(f.name))
            raise DraftVerifyError(
                f"the {zoo!r} zoo ships no {opt.what} for {users}: {missing_file_advice(f.name, opt, zoo)}"
            )


def unused_flags(method: str, values: dict[str, Any]) -> list[str]:
    """The flags of declared drafter options given a value other than their default that `method` does not read."""
    read = {f.name for f, _ in drafter_fields(resolve_method(method).drafter)}
    out = []
    for name, (cls, f) in all_fields().items():
        opt = declaration(f)
        if opt is None or not drafters_reading(name) or name in read or name not in values:
            continue
        if values[name] != default_of(f):
            out.append(f"{opt.flag} is used by {', '.join(methods_reading(name))}, not {method!r}; ignored")
    return out

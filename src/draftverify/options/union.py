"""MethodOptions, the union of the declarations: one value per field of SharedOptions and of every options class a
drafter declared (registry.register_methods), each defaulting to its declaration. Built from the registry when
used, so a drafter registered later (a plug-in, a test) is part of it at once."""

from __future__ import annotations

from dataclasses import Field, fields
from pathlib import Path
from typing import Any

from ..errors import DraftVerifyError
from ..registry import DRAFTER_OPTIONS
from .declare import Option, declaration, declared, default_of
from .shared import SharedOptions


def option_classes() -> list[type]:
    """SharedOptions, then each registered options class once, in registration order."""
    seen: dict[type, None] = {SharedOptions: None}
    for classes in DRAFTER_OPTIONS.values():
        seen.update(dict.fromkeys(classes))
    return list(seen)


def all_fields() -> dict[str, tuple[type, Field]]:
    """Every field of the union: name -> (declaring class, field). Two classes declaring one name or one flag is a
    programming error, said at once."""
    out: dict[str, tuple[type, Field]] = {}
    flags: dict[str, str] = {}
    for cls in option_classes():
        for f in fields(cls):
            if f.name in out:
                raise RuntimeError(f"option {f.name!r} declared by both {out[f.name][0].__name__} and {cls.__name__}")
            out[f.name] = (cls, f)
            opt = declaration(f)
            if opt is not None:
                if opt.flag in flags:
                    raise RuntimeError(f"flag {opt.flag} declared for both {flags[opt.flag]!r} and {f.name!r}")
                flags[opt.flag] = f.name
    return out


def drafter_fields(drafter: str) -> list[tuple[Field, Option]]:
    """The declared fields drafter `drafter` reads."""
    return [pair for cls in DRAFTER_OPTIONS.get(drafter, ()) for pair in declared(cls)]


def drafters_reading(name: str) -> list[str]:
    """The drafters that read declared field `name`."""
    return [d for d, classes in DRAFTER_OPTIONS.items() if any(f.name == name for c in classes for f in fields(c))]


def defaults() -> dict[str, Any]:
    return {name: default_of(f) for name, (_, f) in all_fields().items()}


def check_names(values: dict[str, Any]) -> None:
    """Unknown option names: one line naming them and the known ones."""
    known = all_fields()
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise DraftVerifyError(
            f"unknown option(s) {', '.join(unknown)}; the options are: {', '.join(sorted(known))} "
            "(see draftverify.methods.MethodOptions)"
        )


class MethodOptions:
    """Every option value a drafter or verifier may read (each reads only its own fields: options.nat_path).

    MethodOptions(nat_path=DIR, beta=5): unnamed fields take their declaration's default; an unknown name is a
    DraftVerifyError. replace(**changes) gives a copy with some values changed."""

    def __init__(self, **values: Any):
        check_names(values)
        object.__setattr__(self, "_values", {**defaults(), **values})

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        values = self.__dict__["_values"]
        if name not in values:  # declared after this object was made: its default
            known = all_fields()
            if name not in known:
                raise AttributeError(f"no option {name!r}")
            values[name] = default_of(known[name][1])
        return values[name]

    def __setattr__(self, name: str, value: Any) -> None:
        check_names({name: value})
        self._values[name] = value

    def replace(self, **changes: Any) -> "MethodOptions":
        return MethodOptions(**{**self._values, **changes})

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MethodOptions) and self._values == other._values

    def __repr__(self) -> str:
        changed = {k: v for k, v in self._values.items() if v != defaults().get(k)}
        return f"MethodOptions({', '.join(f'{k}={v!r}' for k, v in changed.items())})"


def parse_values(values: dict[str, Any]) -> dict[str, Any]:
    """Values from the command line as the options take them: each declared parse() applied to a text given."""
    out = dict(values)
    for name, (_, f) in all_fields().items():
        opt = declaration(f)
        if opt is not None and opt.parse is not None and isinstance(out.get(name), str):
            out[name] = opt.parse(out[name])
    return out


def zoo_files(folder: Path) -> dict[str, Path]:
    """Each zoo-filled field's path inside zoo entry `folder`, whether it exists or not."""
    return {
        name: folder / opt.zoo
        for name, (_, f) in all_fields().items()
        if (opt := declaration(f)) is not None and opt.zoo is not None
    }


def fill_from_zoo(values: dict[str, Any], folder: Path) -> dict[str, Any]:
    """values with every unset zoo-filled field set to the entry's file, where the entry has it."""
    found = {name: path for name, path in zoo_files(folder).items() if values.get(name) is None and path.exists()}
    return {**values, **found}


def check_files(values: dict[str, Any]) -> None:
    """A zoo-filled field given a path that is not there (or an empty one, which Path reads as the current folder):
    one line naming the flag, before any model loads."""
    for name, (_, f) in all_fields().items():
        opt = declaration(f)
        value = values.get(name)
        if opt is None or opt.zoo is None or value is None:
            continue
        if not str(value).strip():
            raise DraftVerifyError(f"{opt.flag} is empty: give a file or folder path (API: {name}=...)")
        if not Path(value).exists():
            raise DraftVerifyError(f"{opt.flag} {value}: no such file or directory (API: {name}=...)")

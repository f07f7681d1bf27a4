"""How a method option is declared: a dataclass field made with option(), whose metadata carries its flag, help
and the zoo file that fills it; the CLI, load() and the bench read these instead of spelling each option again."""

from __future__ import annotations

import typing
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, Callable

OPTION = "draftverify.option"  # the metadata key of a declared field


@dataclass(frozen=True)
class Option:
    """What a declared field is on the command line and in a zoo entry."""

    flag: str  # e.g. "--nat"
    help: str | Callable[[], str]  # a callable is read when the help is shown (e.g. which zoo entries ship a file)
    zoo: str | None = None  # the file or folder of a zoo entry that fills the field when it is not given
    what: str | None = None  # a zoo file's name in messages ("NAT drafter"): its drafters cannot run without it
    parse: Callable[[str], Any] | None = None  # the command line's text -> value, where typer cannot convert it
    advice: Callable[[str | None], str] | None = None  # what to do when a needed file is missing (zoo name or None)

    def help_text(self) -> str:
        return self.help() if callable(self.help) else self.help


def option(
    default: Any,
    flag: str,
    help: str | Callable[[], str],
    *,
    zoo: str | None = None,
    what: str | None = None,
    parse: Callable[[str], Any] | None = None,
    advice: Callable[[str | None], str] | None = None,
) -> Any:
    """A dataclass field with one default and its flag, help and zoo file (see Option)."""
    if zoo is not None and what is None:
        raise TypeError(f"{flag}: a zoo-filled option names what it is (what=...), for the messages that miss it")
    return field(default=default, metadata={OPTION: Option(flag, help, zoo, what, parse, advice)})


def declaration(f: Field) -> Option | None:
    """The field's Option, or None for a plain field (an API-only setting, e.g. the draft model object)."""
    return f.metadata.get(OPTION)


def default_of(f: Field) -> Any:
    if f.default is not MISSING:
        return f.default
    assert callable(f.default_factory)  # a declared field has a default or a factory
    return f.default_factory()


def field_types(cls: type) -> dict[str, Any]:
    """The fields' annotations as types (declaration modules may use postponed annotations)."""
    return typing.get_type_hints(cls)


def declared(cls: type) -> list[tuple[Field, Option]]:
    """The declared (flagged) fields of an options class, in order."""
    return [(f, opt) for f in fields(cls) if (opt := declaration(f)) is not None]

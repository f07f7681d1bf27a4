"""The method registry. A drafter is declared in one call, register_methods(DrafterSpec(...)): its class, the options
classes it reads and the methods it serves (each with its verifier, summary, whether it needs a draft model, is
lossless and batches). That call fills every table the CLI, the server, the bench and load() read:
METHODS (method -> Method), DRAFTERS (drafter -> class) and DRAFTER_OPTIONS (drafter -> options classes).

The built-in declarations live in torch-free modules (draftverify/options/<family>.py) and name their drafter
class lazily, as "module:Class": `draftverify --help` and `draftverify methods` read every declaration (flags,
which methods batch or take a draft) without importing torch, which every drafter module does; the class is
imported when a drafter is first looked up. A plug-in may pass its class itself (its import is its own cost)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from .errors import DraftVerifyError

if TYPE_CHECKING:  # the drafter and verifier modules import torch; the registry stays torch-free
    from .drafters.base import Drafter
    from .verifiers.base import Verifier

T = TypeVar("T")
V = TypeVar("V", bound="Verifier")


@dataclass(frozen=True)
class MethodEntry:
    """One method a drafter serves, as its declaration states it."""

    summary: str
    verifier: str = "exact"  # a registered verifier name, or "exact" (verifiers/exact.py picks the lossless rule)
    needs_draft: bool = False  # the drafter runs a separate draft model (draft=... / --draft)
    lossless: bool = True  # the text is the target's own (greedy) / distributed as the target's (sampling)
    batches: bool | None = None  # decodes several rows at once; None: as the drafter does (its verifier judges rows)


@dataclass(frozen=True)
class DrafterSpec:
    """A drafter's one declaration: name, class ("module:Class" or the class), options classes, methods."""

    name: str
    cls: str | type
    methods: dict[str, MethodEntry]
    options: tuple[type, ...] = ()
    batches: bool = True  # drafts for several left-padded rows at once: the class's supports_batch
    # an option naming a piece's folder that also takes the GGUF file llama.cpp's converter makes of it (the drafter
    # then runs that piece in llama.cpp, beside a llama.cpp target): the bench's `<method>_gguf` rows
    gguf_option: str | None = None


@dataclass(frozen=True)
class Method:
    """A registered method: its drafter and verifier by name, and what its declaration says of it."""

    drafter: str
    verifier: str  # a registered verifier name, or "exact"
    summary: str
    needs_draft: bool = False
    lossless: bool = True
    batches: bool = False
    name: str = ""
    gguf_option: str | None = None  # DrafterSpec.gguf_option

    def drafter_class(self) -> type[Drafter]:
        """The drafter's class (imports its module: torch)."""
        return lookup(DRAFTERS, "drafter", self.drafter)

    @property
    def needs_target_modules(self) -> str:
        """What of a Hugging Face target's modules the drafter reads ("" if only the backend protocol)."""
        return self.drafter_class().needs_target_modules


class LazyClasses(MutableMapping[str, "type[Drafter]"]):
    """name -> class, where a class may be given as "module:Class" and is imported when first read. On import the
    class gets its registry name (cls.name) and is checked against the declaration (whether it batches)."""

    def __init__(self) -> None:
        self._refs: dict[str, str | type[Drafter]] = {}
        self._batches: dict[str, bool] = {}

    def declare(self, name: str, ref: str | type[Drafter], batches: bool | None = None) -> None:
        if not isinstance(ref, str):
            self._check(name, ref, batches)
        self._refs[name] = ref
        if batches is not None:
            self._batches[name] = batches
        if not isinstance(ref, str):
            ref.name = name

    def __getitem__(self, name: str) -> type[Drafter]:
        ref = self._refs[name]
        if isinstance(ref, str):
            module, _, attr = ref.partition(":")
            ref = getattr(importlib.import_module(module), attr)
            assert isinstance(ref, type), f"{module}:{attr} is not a class"
            self._check(name, ref, self._batches.get(name))
            ref.name = name
            self._refs[name] = ref
        return ref

    @staticmethod
    def _check(name: str, cls: type[Drafter], batches: bool | None) -> None:
        if batches is not None and getattr(cls, "supports_batch", batches) != batches:
            raise RuntimeError(
                f"drafter {name!r} is declared with batches={batches} but {cls.__name__}."
                f"supports_batch is {cls.supports_batch}: make the declaration say what the class does"
            )

    def __setitem__(self, name: str, cls: type[Drafter]) -> None:
        self._refs[name] = cls

    def __delitem__(self, name: str) -> None:
        del self._refs[name]
        self._batches.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(self._refs)

    def __len__(self) -> int:
        return len(self._refs)


METHODS: dict[str, Method] = {}
DRAFTERS = LazyClasses()
VERIFIERS: dict[str, type[Verifier]] = {}
# drafter name -> the options classes it reads (torch-free declarations: the CLI builds its flags from them)
DRAFTER_OPTIONS: dict[str, tuple[type, ...]] = {}
SPECS: dict[str, DrafterSpec] = {}  # drafter name -> its declaration


def register_methods(spec: DrafterSpec) -> DrafterSpec:
    """Register a drafter's declaration: its class, options and methods. A name taken twice is a programming error."""
    if spec.name in SPECS:
        raise RuntimeError(f"drafter {spec.name!r} registered twice")
    taken = sorted(set(spec.methods) & set(METHODS))
    if taken:
        raise RuntimeError(f"method(s) {', '.join(taken)} registered twice")
    DRAFTERS.declare(spec.name, spec.cls, spec.batches)  # first: a class that disagrees leaves no trace
    SPECS[spec.name] = spec
    if spec.options:
        DRAFTER_OPTIONS[spec.name] = spec.options
    for name, entry in spec.methods.items():
        batches = spec.batches if entry.batches is None else entry.batches and spec.batches
        METHODS[name] = Method(
            spec.name,
            entry.verifier,
            entry.summary,
            entry.needs_draft,
            entry.lossless,
            batches,
            name,
            spec.gguf_option,
        )
    return spec


def unregister_methods(name: str) -> None:
    """Undo register_methods for drafter `name` (tests, plug-in reloads)."""
    spec = SPECS.pop(name)
    del DRAFTERS[name]
    DRAFTER_OPTIONS.pop(name, None)
    for method in spec.methods:
        METHODS.pop(method, None)


PLUGIN_GROUP = "draftverify.methods"  # entry points naming modules whose import calls register_methods


def load_plugins() -> None:
    """Import every installed plug-in's declaration module: a package adds a method with one line in its
    pyproject.toml, [project.entry-points."draftverify.methods"] toy = "toy_pkg.toy"."""
    from importlib.metadata import entry_points

    for point in entry_points(group=PLUGIN_GROUP):
        point.load()


def register_verifier(name: str) -> Callable[[type[V]], type[V]]:
    def decorator(cls: type[V]) -> type[V]:
        if name in VERIFIERS:
            raise RuntimeError(f"verifier {name!r} registered twice")
        VERIFIERS[name] = cls
        cls.name = name
        return cls

    return decorator


def lookup(table: Mapping[str, T], kind: str, name: str) -> T:
    try:
        return table[name]
    except KeyError:
        raise DraftVerifyError(f"unknown {kind} {name!r}; choose one of: {', '.join(sorted(table))}") from None

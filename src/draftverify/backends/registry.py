"""Backends by name: what `--backend` and load(backend=...) choose from, and what each can do and loads with.

An entry names its LMBackend class and its loader as "module:attribute", imported on first use, so listing the
backends (help, a bad --backend) imports neither transformers nor llama.cpp. A backend of one's own plugs in with
`register_backend(BackendEntry(...))`; choosing one is a lookup here, never a comparison of names elsewhere.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from typing import Any

from ..errors import DraftVerifyError
from . import LLAMACPP_INSTALL
from .base import is_backend


@dataclass(frozen=True)
class BackendEntry:
    name: str  # as --backend spells it
    summary: str  # what runs the models, for messages
    backend: str  # "module:Class" of its LMBackend (check_backend reads the class's capability flags)
    # "module:function" that load() calls to load a target (and draft) by path and return the Pipeline; None for a
    # backend that runs draft models only, chosen per model (lean)
    loader: str | None = None
    # "module:function" putting a bare torch model on this backend, (model, role, compile) -> LMBackend: what
    # generate() and the drafters do with a model given in place of a backend (as_backend); None: it takes none
    wraps: str | None = None
    compiles: bool = False  # --compile (torch.compile) applies to its models
    batches: bool = False  # decodes several prompts at once (--batch-size > 1)
    gpu: bool = False  # runs on a --device other than cpu (the llama-cpp-python built here is CPU-only)
    requires: str | None = None  # a module that an optional extra installs, or None
    package: str | None = None  # the package that provides it, for messages
    install: str | None = None  # the command that installs it
    own_options: tuple[str, ...] = ()  # load() options only this backend reads

    @property
    def runs_target(self) -> bool:
        return self.loader is not None

    def backend_class(self) -> type:
        return _attribute(self.backend)

    def load(self, *args: Any, **kwargs: Any):
        """Its loader on load()'s arguments (api.load hands them over after checking them)."""
        assert self.loader is not None  # target_backend hands out only the entries that run a target
        return _attribute(self.loader)(*args, **kwargs)

    def installed(self) -> bool:
        return self.requires is None or importlib.util.find_spec(self.requires) is not None


def _attribute(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


BACKENDS: dict[str, BackendEntry] = {}


def register_backend(entry: BackendEntry) -> BackendEntry:
    if entry.name in BACKENDS:
        raise DraftVerifyError(f"a backend named {entry.name!r} is registered already")
    BACKENDS[entry.name] = entry
    return entry


def target_backends() -> list[str]:
    """The names --backend takes: the backends that run a target, in registration order."""
    return [name for name, entry in BACKENDS.items() if entry.runs_target]


def backends_that(capability: str) -> str:
    """The target backends whose entry says `capability` ("compiles", "batches"), as "a or b" for messages."""
    return " or ".join(name for name in target_backends() if getattr(BACKENDS[name], capability))


def target_backend(name: object, what: str = "backend") -> BackendEntry:
    """The entry of a backend that runs a target, or one line naming the known ones (`what`: the argument's name
    in the message, "--backend" for the CLI)."""
    entry = BACKENDS.get(name) if isinstance(name, str) else None
    if entry is None or not entry.runs_target:
        raise DraftVerifyError(f"{what} must be one of {', '.join(target_backends())}, got {name!r}")
    return entry


def as_backend(model, role: str, compile: bool = False):
    """A backend as it is; a bare model on the first registered backend that wraps models (the hf backend: a
    CachedLM, with compile preallocated and compiled)."""
    if is_backend(model):
        return model
    wrap = next(entry.wraps for entry in BACKENDS.values() if entry.wraps is not None)
    return _attribute(wrap)(model, role, compile)


register_backend(
    BackendEntry(
        "hf",
        "Hugging Face transformers",
        "draftverify.backends.hf.cached_lm:CachedLM",
        loader="draftverify.api:load_hf",
        wraps="draftverify.backends.hf.cached_lm:cached_model",
        compiles=True,
        batches=True,
        gpu=True,
    )
)
register_backend(
    BackendEntry(
        "llamacpp",
        "llama.cpp through llama-cpp-python",
        "draftverify.backends.llamacpp:LlamaCppLM",
        loader="draftverify.api:load_llamacpp",
        batches=True,
        requires="llama_cpp",
        package="llama-cpp-python",
        install=LLAMACPP_INSTALL,
        own_options=("draft_gguf", "target_gguf", "flash_attn"),
    )
)
register_backend(
    BackendEntry(
        "lean",
        "plain torch ops over a preallocated KV buffer (Llama-style draft models)",
        "draftverify.backends.lean_draft:LeanDraft",
    )
)

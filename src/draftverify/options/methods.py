"""How a drafter that serves one method of its own name (most do) registers: one call naming the drafter, its class,
its options classes and the method's summary, in place of the DrafterSpec and MethodEntry spelled out (registry.py;
a drafter with several methods, or with settings of its own spec, spells them out)."""

from __future__ import annotations

from typing import Any

from ..registry import DrafterSpec, MethodEntry, register_methods


def register_method(
    name: str, cls: str | type, summary: str, options: tuple[type, ...] = (), **entry: Any
) -> DrafterSpec:
    """register_methods of drafter `name` (class `cls`, reading `options`) serving the method `name`, described by
    `summary`; `entry`: MethodEntry's other fields (needs_draft, verifier, ...)."""
    return register_methods(DrafterSpec(name, cls, options=options, methods={name: MethodEntry(summary, **entry)}))

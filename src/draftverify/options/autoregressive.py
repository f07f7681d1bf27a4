"""The baseline: the target alone in our loop, through the drafter that drafts nothing (drafters/base.py)."""

from __future__ import annotations

from ..registry import DrafterSpec, MethodEntry, register_methods

register_methods(
    DrafterSpec(
        "none",
        "draftverify.drafters.base:NoDrafter",
        methods={
            "autoregressive": MethodEntry("the target alone in our loop (no drafting): the baseline"),
        },
    )
)

"""EAGLE-3's options (drafters/eagle3.py): the trained head a zoo entry may ship as eagle3/."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..registry import DrafterSpec, MethodEntry, register_methods
from .declare import option


@dataclass(frozen=True)
class Eagle3Options:  # eagle3
    eagle3_path: Path | None = option(
        None,
        "--eagle3",
        "EAGLE-3 head folder (config.json + model.safetensors; `draftverify train eagle3` makes one).",
        zoo="eagle3",
        what="EAGLE-3 head",
    )


register_methods(
    DrafterSpec(
        "eagle3",
        "draftverify.drafters.eagle3:Eagle3Drafter",
        options=(Eagle3Options,),
        batches=False,
        methods={
            "eagle3": MethodEntry(
                "EAGLE-3: a one-layer head on three of the target's layers' features drafts a chain, verified exactly"
            ),
        },
    )
)

"""A toy method with options, declared the way a new method is: this one file (its options, its drafter, one
register_methods call) plus one registration line elsewhere (an import, or a plug-in's entry point
[project.entry-points."draftverify.methods"] toy = "toy_method"). Nothing in the package is edited."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from draftverify import DraftVerifyError
from draftverify.drafters.base import Drafter, empty_draft
from draftverify.options import option
from draftverify.registry import DrafterSpec, MethodEntry, register_methods


@dataclass(frozen=True)
class ToyOptions:
    toy_path: Path | None = option(None, "--toy", "The toy drafter's weights file.", zoo="toy.json", what="toy weights")
    toy_scale: float = option(0.5, "--toy-scale", "How far the toy trusts itself.")


class ToyDrafter(Drafter):
    """Reads its weights file and drafts nothing (so its text is the target's own)."""

    supports_batch = True
    built: list[tuple[Path, float, dict]] = []

    @classmethod
    def from_options(cls, target, options) -> ToyDrafter:
        if options.toy_path is None:
            raise DraftVerifyError("the toy drafter needs its weights: pass --toy FILE")
        cls.built.append((Path(options.toy_path), options.toy_scale, json.loads(Path(options.toy_path).read_text())))
        return cls()

    def propose(self, state, gamma: int):
        return empty_draft(state)


register_methods(
    DrafterSpec(
        "toy",
        ToyDrafter,
        options=(ToyOptions,),
        methods={
            "toy": MethodEntry("a toy drafter with a weights file"),
        },
    )
)

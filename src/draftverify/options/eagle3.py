"""EAGLE-3's options (drafters/eagle3.py, eagle3_tree.py): the trained head a zoo entry may ship as eagle3/, and
the dynamic tree's width and node budget."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..registry import DrafterSpec, MethodEntry, register_methods
from .declare import option


@dataclass(frozen=True)
class Eagle3Options:  # eagle3, eagle3_tree
    eagle3_path: Path | None = option(
        None,
        "--eagle3",
        "EAGLE-3 head folder (config.json + model.safetensors; `draftverify train eagle3` makes one), or its GGUF "
        "file (`draftverify export eagle3 --gguf f16`), which method eagle3 runs in llama.cpp (--backend llamacpp).",
        zoo="eagle3",
        what="EAGLE-3 head",
    )


@dataclass(frozen=True)
class Eagle3TreeOptions:  # eagle3_tree
    eagle3_top_k: int = option(
        4, "--eagle3-topk", "EAGLE-3 tree: children of each expanded node, and nodes expanded per level."
    )
    eagle3_nodes: int = option(
        16, "--eagle3-nodes", "EAGLE-3 tree: most nodes verified per step (fewer when gamma auto / conf sizes it)."
    )


register_methods(
    DrafterSpec(
        "eagle3",
        "draftverify.drafters.eagle3:Eagle3Drafter",
        options=(Eagle3Options,),
        gguf_option="eagle3_path",
        methods={
            "eagle3": MethodEntry(
                "EAGLE-3: a one-layer head on three of the target's layers' features drafts a chain, verified exactly"
            ),
        },
    )
)

register_methods(
    DrafterSpec(
        "eagle3_tree",
        "draftverify.drafters.eagle3_tree:Eagle3TreeDrafter",
        options=(Eagle3Options, Eagle3TreeOptions),
        batches=False,
        methods={
            "eagle3_tree": MethodEntry(
                "EAGLE-3's head expands EAGLE-2's dynamic tree (best nodes by draft probability), verified at once"
            ),
        },
    )
)

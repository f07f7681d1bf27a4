"""BiTA's options (drafters/bita.py): the trained adapter a zoo entry may ship as bita/, how many of its mask
tokens draft, and the tree's width (bita_chain takes each mask's top-1 only)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..registry import DrafterSpec, MethodEntry, register_methods
from .declare import option


@dataclass(frozen=True)
class BitaOptions:  # bita, bita_tree, bita_chain
    bita_path: Path | None = option(
        None,
        "--bita",
        "BiTA adapter folder (bita.json + bita.safetensors; `draftverify train bita` makes one).",
        zoo="bita",
        what="BiTA adapter",
    )
    bita_masks: int | None = option(
        None, "--bita-masks", "Use the adapter's first m mask tokens (default: all it was trained with)."
    )


@dataclass(frozen=True)
class BitaTreeOptions:  # bita, bita_tree
    bita_topk: int = option(3, "--bita-topk", "Candidates per mask token.")


register_methods(
    DrafterSpec(
        "bita",
        "draftverify.drafters.bita:BitaEfficientDrafter",
        options=(BitaOptions, BitaTreeOptions),
        methods={
            "bita": MethodEntry(
                "BiTA: learned mask tokens on the frozen target draft an efficient top-k tree in its verify pass"
            ),
        },
    )
)

register_methods(
    DrafterSpec(
        "bita_tree",
        "draftverify.drafters.bita:BitaFullTreeDrafter",
        options=(BitaOptions, BitaTreeOptions),
        methods={
            "bita_tree": MethodEntry("BiTA with the full top-k tree (k + k^2 + ... + k^M candidates)"),
        },
    )
)

register_methods(
    DrafterSpec(
        "bita_chain",
        "draftverify.drafters.bita:BitaDrafter",
        options=(BitaOptions,),
        methods={
            "bita_chain": MethodEntry("BiTA's straightforward decoding: the previous pass's mask tokens' top-1 chain"),
        },
    )
)

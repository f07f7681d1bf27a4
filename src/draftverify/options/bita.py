"""BiTA's options (drafters/bita.py): the trained adapter a zoo entry may ship as bita/, how many of its mask
tokens draft, and the tree's width (bita_chain takes each mask's top-1 only)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .declare import option
from .methods import register_method


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


register_method(
    "bita",
    "draftverify.drafters.bita:BitaEfficientDrafter",
    "BiTA: learned mask tokens on the frozen target draft an efficient top-k tree in its verify pass",
    (BitaOptions, BitaTreeOptions),
)

register_method(
    "bita_tree",
    "draftverify.drafters.bita:BitaFullTreeDrafter",
    "BiTA with the full top-k tree (k + k^2 + ... + k^M candidates)",
    (BitaOptions, BitaTreeOptions),
)

register_method(
    "bita_chain",
    "draftverify.drafters.bita:BitaDrafter",
    "BiTA's straightforward decoding: the previous pass's mask tokens' top-1 chain",
    (BitaOptions,),
)

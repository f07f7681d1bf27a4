"""The early-exit drafter's option (drafters/early_exit.py): how many of the target's layers draft."""

from __future__ import annotations

from dataclasses import dataclass

from ..registry import DrafterSpec, MethodEntry, register_methods
from ..zoo import trained_exit_layers
from .declare import option


def trained_exits_note() -> str:
    """Which zoo targets were trained to exit early, and where (a draft of that many layers is the one trained)."""
    layers = trained_exit_layers()
    return "".join(
        f" The {zoo} zoo's target was trained to exit at layer {n}: --zoo {zoo} --early-exit-layers {n}."
        for zoo, n in layers.items()
    )


@dataclass(frozen=True)
class EarlyExitOptions:
    early_exit_layers: int = option(
        1, "--early-exit-layers", lambda: "Layers of the target used as the draft." + trained_exits_note()
    )


register_methods(
    DrafterSpec(
        "early_exit",
        "draftverify.drafters.early_exit:EarlyExitDrafter",
        options=(EarlyExitOptions,),
        methods={
            "early_exit": MethodEntry("the target's first L layers + its LM head draft (shared weights)"),
            "bild_early_exit": MethodEntry(
                "BiLD with the early-exit small model (BiLD section 4.4)",
                verifier="bild",
                lossless=False,
                batches=False,
            ),
        },
    )
)

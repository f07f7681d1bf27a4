"""The NAT drafter's options (specdec, specdec++_nat; drafters/nat.py): the folder of a trained drafter, which a
zoo entry may ship as nat/ and `draftverify train nat` makes, and what to say when there is none."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..registry import DrafterSpec, MethodEntry, register_methods
from ..zoo import shipped, zoo_default_method
from .declare import option

# docs/zoo.md's training recipes: for a decoder-only target (the code zoo's) and for a translation target (the translate
# zoo's, on `draftverify train distill` targets)
TRAIN_NAT = (
    "draftverify train nat --target {target} --out runs/nat-code/run --work-dir runs/nat-code "
    "--export {export} --max-minutes 25 --threads 1"
)
TRAIN_NAT_TRANSLATION = (
    "draftverify train nat --target {target} --train-targets DISTILLED.de --out runs/nat --export {export}"
)


def nat_advice(zoo: str | None = None, translation: bool = False) -> str:
    """What to do when a NAT method has no drafter: which zoo ships one, and how to train one (one line)."""
    target = f"zoo/{zoo}/target" if zoo else "TARGET"
    export = f"zoo/{zoo}/nat" if zoo else "DIR"
    recipe = (TRAIN_NAT_TRANSLATION if translation else TRAIN_NAT).format(target=target, export=export)
    other = f" (this zoo's default: {zoo_default_method(zoo)})" if zoo else ""
    return (
        f"{shipped('nat')}; pass --nat DIR (API: nat_path=DIR) with a drafter trained for this target, e.g. "
        f"`{recipe}`, or use another method{other}"
    )


@dataclass(frozen=True)
class NATOptions:
    nat_path: Path | None = option(
        None,
        "--nat",
        lambda: (
            f"NAT drafter folder (nat.json + nat.safetensors; {shipped('nat')}; for another target "
            "train one with `draftverify train nat --target TARGET ...`, see docs/zoo.md)."
        ),
        zoo="nat",
        what="NAT drafter",
        advice=nat_advice,
    )


register_methods(
    DrafterSpec(
        "nat",
        "draftverify.drafters.nat:NatDrafter",
        options=(NATOptions,),
        methods={
            "specdec": MethodEntry(
                "SpecDec: a non-autoregressive drafter fills k mask slots in one pass (over the encoder "
                "states, or a decoder-only target's own hidden states); needs a trained NAT drafter (--nat; "
                "the code and translate zoos ship one, `draftverify train nat` makes one)"
            ),
            "specdec++_nat": MethodEntry(
                "SpecDec++ as in the paper: the NAT drafter under top-beta / tau; needs a NAT drafter like specdec",
                verifier="topbeta",
                lossless=False,
                batches=False,
            ),
        },
    )
)

"""The n-gram table's option (ngram, and the lattice rescoring of bpd_ngram / bpd_pbest): a table a zoo entry may
ship as ngram.safetensors."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..registry import DrafterSpec, MethodEntry, register_methods
from .declare import option


@dataclass(frozen=True)
class NgramOptions:
    ngram_path: Path | None = option(
        None,
        "--ngram",
        "n-gram table (safetensors; `draftverify train ngram` makes one with the target's tokenizer).",
        zoo="ngram.safetensors",
        what="n-gram table",
    )


register_methods(
    DrafterSpec(
        "ngram",
        "draftverify.drafters.ngram:NgramDrafter",
        options=(NgramOptions,),
        methods={
            "ngram": MethodEntry("a negligible-cost n-gram table drafts (works under sampling too)"),
        },
    )
)

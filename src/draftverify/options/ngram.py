"""The n-gram table's option (ngram, and the lattice rescoring of bpd_ngram / bpd_pbest): a table a zoo entry may
ship as ngram.safetensors."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .declare import option
from .methods import register_method


@dataclass(frozen=True)
class NgramOptions:
    ngram_path: Path | None = option(
        None,
        "--ngram",
        "n-gram table (safetensors; `draftverify train ngram` makes one with the target's tokenizer).",
        zoo="ngram.safetensors",
        what="n-gram table",
    )


register_method(
    "ngram",
    "draftverify.drafters.ngram:NgramDrafter",
    "a negligible-cost n-gram table drafts (works under sampling too)",
    (NgramOptions,),
)

"""Blockwise parallel decoding's options (drafters/blockwise*.py): the trained heads a zoo entry may ship as heads/,
and the knobs of the rescored lattice. One small class per set of drafters that reads it, so each flag's help
names exactly the methods it changes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .declare import option
from .methods import register_method
from .ngram import NgramOptions


@dataclass(frozen=True)
class HeadsOptions:  # bpd, bpd_ngram, bpd_pbest, bpd_neural
    heads_path: Path | None = option(
        None,
        "--heads",
        "Blockwise heads folder (heads.json + heads.safetensors; `draftverify train heads` makes one).",
        zoo="heads",
        what="blockwise heads",
    )


@dataclass(frozen=True)
class LatticeOptions:  # bpd_ngram, bpd_pbest, bpd_neural
    lattice_k: int = option(4, "--lattice-k", "Candidates per head in the top-k lattice.")


@dataclass(frozen=True)
class NgramRescoreOptions:  # bpd_ngram, bpd_pbest
    ngram_weight: float = option(
        0.5, "--ngram-weight", "n-gram weight alpha against the heads' log-probs (0 = heads only)."
    )


@dataclass(frozen=True)
class PBestOptions:  # bpd_pbest
    pbest: int = option(4, "--pbest", "Rescored lattice paths merged into one tree.")


@dataclass(frozen=True)
class NeuralRescoreOptions:  # bpd_neural
    rescore_weight: float = option(
        1.0, "--rescore-weight", "Weight alpha of the draft model's logits against the heads'."
    )


register_method(
    "bpd",
    "draftverify.drafters.blockwise:BlockwiseDrafter",
    "blockwise parallel decoding: heads on the target's hidden state draft in its verify pass",
    (HeadsOptions,),
)

register_method(
    "bpd_ngram",
    "draftverify.drafters.blockwise_lattice:BlockwiseNgramDrafter",
    "bpd with the heads' top-k lattice rescored by an n-gram table (best path)",
    (HeadsOptions, NgramOptions, LatticeOptions, NgramRescoreOptions),
)

register_method(
    "bpd_neural",
    "draftverify.drafters.blockwise_neural:BlockwiseNeuralDrafter",
    "bpd with each head's top-k rescored left to right by the draft model (local neural rescoring)",
    (HeadsOptions, LatticeOptions, NeuralRescoreOptions),
    needs_draft=True,
)

register_method(
    "bpd_pbest",
    "draftverify.drafters.blockwise_lattice:BlockwisePBestDrafter",
    "bpd's p best n-gram-rescored lattice paths merged into one token tree",
    (HeadsOptions, NgramOptions, LatticeOptions, NgramRescoreOptions, PBestOptions),
)

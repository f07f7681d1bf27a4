"""Settings that belong to no single drafter: the draft model, the tokenizers and compile (load() and Pipeline fill
them from draft=, the models and compile=; plain fields, so no flag of their own), and the thresholds of BiLD and the
verifiers, which several methods read (flags of `generate` and `serve`; `bench` sweeps BiLD's as grids of its own)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .declare import option


@dataclass(frozen=True)
class SharedOptions:
    draft_model: Any = None  # a transformers PreTrainedModel (or CachedLM) for methods with needs_draft
    # the draft model's own tokenizer when its vocabulary differs from the target's (load() compares them): the
    # `model` drafter then runs as `cross_tokenizer`; None: the draft shares the target's vocabulary
    draft_tokenizer: Any = None
    target_tokenizer: Any = None  # the target's tokenizer (cross_tokenizer reads it; Pipeline fills it in)
    compile: bool = False  # draft models: preallocated cache + torch.compile, like the target's --compile
    # draft models on the hf backend run on LeanLM where it applies (backends/lean_draft.py); False keeps CachedLM
    lean_draft: bool = True
    alpha_fb: float = option(
        0.0,
        "--alpha-fb",
        "BiLD fallback threshold in [0, 1] (0 = never); the drafters model, "
        "lookup_model and early_exit stop drafting below it.",
    )
    alpha_rb: float = option(2.0, "--alpha-rb", "BiLD rollback threshold on -log p_target(x), >= 0.")
    lenience: float = option(1.0, "--lenience", "Leviathan A.5 lenience l in (0, 1]; 1 = exact.")
    beta: int = option(3, "--beta", "SpecDec++ top-beta.")
    tau: float = option(1.0, "--tau", "SpecDec++ tolerance tau.")
    # staged drafting (drafters/draft_positions.py StagedForwards): the draft forward also scores a prompt-lookup
    # continuation and keeps the tokens it would have chosen anyway, so one forward can yield several draft tokens
    lookup_tokens: int = option(
        5,
        "--lookup-tokens",
        "Staged drafting: prompt-lookup tokens each draft-model "
        "forward also scores, kept where the draft chooses them too (0 = off; a compiled "
        "draft stages nothing). Methods model, bild, specdec++ and earn (its draft model).",
    )
    lookup_confirms: bool = option(
        True,
        "--lookup-confirms",
        "Staged drafting: a drafted token that prompt lookup "
        "proposes too counts as confident for gamma conf's stop, whatever its max q.",
    )

"""Settings that belong to no single drafter: the draft model and compile (load() fills them from draft= and
compile=), BiLD's thresholds and the verifiers' knobs."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class SharedOptions:
    draft_model: Any = None  # a transformers PreTrainedModel (or CachedLM) for methods with needs_draft
    compile: bool = False  # draft models: preallocated cache + torch.compile, like the target's --compile
    ngram_path: str | Path | None = None
    heads_path: str | Path | None = None  # bpd*: folder of trained blockwise heads (heads.json + heads.safetensors)
    bita_path: str | Path | None = None  # bita*: folder of a trained adapter (bita.json + bita.safetensors)
    bita_topk: int = 3  # bita / bita_tree: candidates per mask token (bita_chain uses the top-1 only)
    bita_masks: int | None = None  # bita*: use the adapter's first m mask tokens (None = all it was trained with)
    lattice_k: int = 4  # bpd_ngram / bpd_pbest: candidates per head in the top-k lattice
    ngram_weight: float = 0.5  # alpha: weight of the n-gram score against the heads' log-probs
    pbest: int = 4  # bpd_pbest: rescored paths merged into the verified tree
    rescore_weight: float = 1.0  # bpd_neural: alpha, weight of the draft model's logits against the heads'
    early_exit_layers: int = 1
    prompt_lookup_max_ngram: int = 3
    prompt_lookup_min_ngram: int = 1
    prompt_lookup_matches: int = 4  # prompt_lookup_tree: continuations merged into one tree
    tree_paths: list[tuple[int, ...]] | None = None  # model_tree: Medusa-style paths (None = the drafter's default)
    # lookup_model copies only on a match of >= 2 tokens: a 1-token match is a weaker guess than the draft
    # model's (code zoo v2, benchmarks/lookup-model-counts.md: 3.20 vs 2.95 tokens per call greedy, 2.36 vs 2.05 at T=0.8)
    lookup_model_min_ngram: int = 2
    alpha_fb: float = 0.0  # BiLD fallback threshold (0 = never fall back)
    alpha_rb: float = 2.0  # BiLD rollback threshold on -log p_target(x)
    lenience: float = 1.0
    beta: int = 3
    tau: float = 1.0

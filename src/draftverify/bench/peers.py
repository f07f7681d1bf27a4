"""Other libraries' rows, set up explicitly (each peer has its own knobs): Hugging Face assisted generation and
prompt lookup, and llama.cpp when llama-cpp-python is installed."""

from __future__ import annotations

from transformers import GenerationConfig

from ..methods import MethodOptions
from .config import BenchConfig
from .llamacpp import llamacpp_runners
from .llamacpp_native import native_runners
from .models import BenchModels
from .runners import HFRunner, Hooks, Runner

HF_DEFAULT_ASSISTANT = GenerationConfig()  # transformers' shipped assistant settings (20 tokens, confidence 0.4)


def _gamma_label(g) -> str:
    return f"g={g}" if isinstance(g, int) else str(g)


def hf_assisted_settings(fixed: list[int]) -> list[tuple[str, int | str, dict]]:
    """(label, gamma, assistant settings): constant gamma without the confidence-based early stop (exactly g drafts
    per step, like ours); the heuristic schedule (start 5, +2 after a full accept, -1 otherwise) reset every call,
    like ours; and transformers' shipped assistant defaults (20 tokens, confidence threshold 0.4) as they are."""
    settings: list[tuple[str, int | str, dict]] = [
        (
            _gamma_label(g),
            g,
            {
                "num_assistant_tokens": g,
                "num_assistant_tokens_schedule": "constant",
                "assistant_confidence_threshold": 0.0,
            },
        )
        for g in fixed
    ]
    settings.append(
        (
            "heuristic",
            "heuristic",
            {
                "num_assistant_tokens": 5,
                "num_assistant_tokens_schedule": "heuristic_transient",
                "assistant_confidence_threshold": 0.0,
            },
        )
    )
    settings.append(
        (
            "hf-default",
            "hf-default",
            {
                "num_assistant_tokens": HF_DEFAULT_ASSISTANT.num_assistant_tokens,
                "num_assistant_tokens_schedule": HF_DEFAULT_ASSISTANT.num_assistant_tokens_schedule,
                "assistant_confidence_threshold": HF_DEFAULT_ASSISTANT.assistant_confidence_threshold,
            },
        )
    )
    return settings


def universal_assisted(models: BenchModels) -> dict | None:
    """HFRunner arguments for the draft: {} when it shares the target's tokenizer; the two tokenizers (universal
    assisted generation) when it has its own; None when transformers cannot run the pair (same vocabulary size)."""
    if models.draft is None or models.draft_tokenizer is None:
        return {}
    widths = {m.get_output_embeddings().weight.shape[0] for m in (models.target, models.draft)}
    if len(widths) == 1:
        return None
    return {"tokenizer": models.tokenizer, "assistant_tokenizer": models.draft_tokenizer}


def sampling_fails(models: BenchModels) -> bool:
    """Whether transformers' universal speculative decoding (sampling with a draft of its own tokenizer) breaks on
    this pair: it prunes the draft's LM head to the tokens the vocabularies share, and when that is every draft
    token it never sets the index it reads (assistant_overlap_token_ids)."""
    target = models.tokenizer.get_vocab()
    return all(token in target for token in models.draft_tokenizer.get_vocab())


def peer_runners(config: BenchConfig, models: BenchModels, hooks: Hooks) -> tuple[list[Runner], list[str]]:
    notes: list[str] = []
    hf = dict(model=models.target, hooks=hooks, eos_token_id=models.eos_token_id, pad_token_id=models.pad_token_id)
    fixed = [g for g in config.gammas if isinstance(g, int)]
    runners: list[Runner] = []
    if config.wants("hf_assisted"):
        universal = universal_assisted(models)  # the draft's own tokenizer: universal assisted generation
        if models.draft is None:
            notes.append("hf_assisted skipped: no draft model")
        elif universal is None:
            notes.append(
                "hf_assisted skipped: the draft has its own tokenizer but as many logits as the target, and "
                "transformers tells tokenizers apart by vocabulary size (it would refuse assistant_tokenizer)"
            )
        else:
            greedy_only = bool(universal) and sampling_fails(models)
            if greedy_only and any(t > 0 for t in config.temperatures):
                notes.append(
                    "hf_assisted runs greedy only with this draft: every token of its vocabulary is in the "
                    "target's, and transformers' sampling path for a draft with its own tokenizer "
                    "(UniversalSpeculativeDecodingGenerator) then fails (AttributeError: "
                    "assistant_overlap_token_ids, transformers 5.23)"
                )
            for label, g, assistant_settings in hf_assisted_settings(fixed):
                runners.append(
                    HFRunner(
                        f"hf_assisted[{label}]",
                        "hf_assisted",
                        gamma=g,
                        **hf,
                        assistant=models.draft,
                        assistant_settings=assistant_settings,
                        **universal,
                        greedy_only=greedy_only,
                        settings={**assistant_settings, **({"universal": True} if universal else {})},
                    )
                )
    if config.wants("hf_prompt_lookup"):
        ngram = MethodOptions().prompt_lookup_max_ngram  # the same longest match as our prompt_lookup drafter
        for g in fixed:
            runners.append(
                HFRunner(
                    f"hf_prompt_lookup[{_gamma_label(g)}]",
                    "hf_prompt_lookup",
                    gamma=g,
                    **hf,
                    prompt_lookup=g,
                    max_matching_ngram_size=ngram,
                    settings={"max_matching_ngram_size": ngram},
                )
            )
    llama, llama_notes = llamacpp_runners(config, models)
    plain = "llamacpp" if any(r.name == "llamacpp" for r in llama) else None  # the native rows' greedy reference
    native, native_notes = native_runners(config, models, reference=plain)
    return runners + llama + native, notes + llama_notes + native_notes

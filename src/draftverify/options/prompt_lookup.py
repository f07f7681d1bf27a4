"""The prompt-lookup drafters' options (drafters/prompt_lookup*.py, lookup_model.py): which n-grams of the context
may match, and how many matches a tree merges."""

from __future__ import annotations

from dataclasses import dataclass

from .declare import option
from .methods import register_method


@dataclass(frozen=True)
class LookupNgramOptions:  # prompt_lookup, prompt_lookup_tree, lookup_model
    prompt_lookup_max_ngram: int = option(3, "--lookup-max-ngram", "Longest n-gram of the context's end to look up.")


@dataclass(frozen=True)
class PromptLookupOptions:  # prompt_lookup, prompt_lookup_tree
    prompt_lookup_min_ngram: int = option(1, "--lookup-min-ngram", "Shortest n-gram match that drafts.")


@dataclass(frozen=True)
class LookupTreeOptions:  # prompt_lookup_tree
    prompt_lookup_matches: int = option(4, "--lookup-matches", "Earlier matches merged into one tree.")


@dataclass(frozen=True)
class LookupModelOptions:  # lookup_model
    # a 1-token match is a weaker guess than the draft model's: it copies whatever followed one common token, so
    # short matches are left to the draft, which has read the whole context
    lookup_model_min_ngram: int = option(
        2,
        "--lookup-model-min-ngram",
        "Shortest n-gram match that copies; shorter ones leave the step to the draft model.",
    )


register_method(
    "prompt_lookup",
    "draftverify.drafters.prompt_lookup:PromptLookupDrafter",
    "copy the continuation of the latest matching n-gram in the context",
    (LookupNgramOptions, PromptLookupOptions),
)

register_method(
    "lookup_model",
    "draftverify.drafters.lookup_model:LookupModelDrafter",
    "copy from the context when its last n-gram recurs, else the draft model drafts",
    (LookupNgramOptions, LookupModelOptions),
    needs_draft=True,
)

register_method(
    "prompt_lookup_tree",
    "draftverify.drafters.prompt_lookup_tree:PromptLookupTreeDrafter",
    "several earlier matches of the last n-gram, merged into one tree",
    (LookupNgramOptions, PromptLookupOptions, LookupTreeOptions),
)

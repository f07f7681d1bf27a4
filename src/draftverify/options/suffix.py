"""The suffix drafter's options (drafters/suffix.py): how long a context it matches, how much history it keeps
across requests, and how sure a draft must be to go on."""

from __future__ import annotations

from dataclasses import dataclass

from .declare import option
from .methods import register_method


@dataclass(frozen=True)
class SuffixOptions:
    suffix_max_match: int | None = option(
        None,
        "--suffix-max-match",
        "Longest end of the context matched against the cache (default: 8, or 24 on llama.cpp; never below "
        "--suffix-min-match).",
    )
    suffix_min_match: int | None = option(
        None,
        "--suffix-min-match",
        "Shortest match that drafts (default: 1, or 24 on llama.cpp, whose verify pass grows dear with its width: "
        "drafts then come seldom and long, as llama.cpp's ngram-mod's; never above a given --suffix-max-match).",
    )
    suffix_cache_tokens: int = option(
        16384,
        "--suffix-cache-tokens",
        "Tokens of prompts and outputs the cache keeps across requests (the oldest requests leave first); its "
        "memory grows by one entry per matched context length for each token.",
    )
    suffix_min_prob: float = option(
        0.1,
        "--suffix-min-prob",
        "A draft stops where its estimated chance to be kept (the product of its continuation frequencies) "
        "falls below this.",
    )


register_method(
    "suffix",
    "draftverify.drafters.suffix:SuffixDrafter",
    "the most frequent continuation of the context's longest suffix in this request and earlier ones "
    "(a cache shared across requests)",
    (SuffixOptions,),
)

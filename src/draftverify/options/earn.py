"""The earn drafter's options (drafters/earn.py): its components' own (the suffix cache's, prompt lookup's) and how
often a source the prices pass over is tried anyway."""

from __future__ import annotations

from dataclasses import dataclass

from .declare import option
from .methods import register_method
from .prompt_lookup import LookupNgramOptions, PromptLookupOptions
from .suffix import SuffixOptions


@dataclass(frozen=True)
class EarnOptions:
    earn_explore_every: int = option(
        16,
        "--earn-explore-every",
        "A source (suffix cache, prompt lookup, draft model) not chosen for this many steps drafts once when it "
        "has a draft, so its measured acceptance stays current.",
    )


register_method(
    "earn",
    "draftverify.drafters.earn:EarnedDrafter",
    "each step the draft that earns most: the suffix cache, prompt lookup or the draft model, priced "
    "by expected accepted tokens over drafting plus the verify pass's measured cost",
    (EarnOptions, SuffixOptions, LookupNgramOptions, PromptLookupOptions),
    needs_draft=True,
)

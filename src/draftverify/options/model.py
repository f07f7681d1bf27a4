"""The draft-model drafters (drafters/model.py, cross_tokenizer.py): no options of their own (the draft model and
BiLD's / SpecDec++'s thresholds are SharedOptions), and the methods that pair them with a verifier."""

from __future__ import annotations

from ..registry import DrafterSpec, MethodEntry, register_methods

register_methods(
    DrafterSpec(
        "model",
        "draftverify.drafters.model:ModelDrafter",
        methods={
            "model": MethodEntry(
                "speculative decoding with a small draft model (Leviathan et al.); a draft with another "
                "tokenizer runs as cross_tokenizer",
                needs_draft=True,
            ),
            "bild": MethodEntry(
                "Big Little Decoder: fallback (alpha_FB) + rollback (alpha_RB)",
                verifier="bild",
                needs_draft=True,
                lossless=False,
                batches=False,
            ),
            "specdec++": MethodEntry(
                "SpecDec++ top-beta / tolerance-tau verification",
                verifier="topbeta",
                needs_draft=True,
                lossless=False,
                batches=False,
            ),
        },
    )
)

register_methods(
    DrafterSpec(
        "cross_tokenizer",
        "draftverify.drafters.cross_tokenizer:CrossTokenizerDrafter",
        batches=False,
        methods={
            "cross_tokenizer": MethodEntry(
                "a draft model with its own tokenizer: its text re-tokenized into target tokens, "
                "a deterministic proposal (universal assisted generation)",
                needs_draft=True,
            ),
        },
    )
)

"""The draft model that the drafters built on one (lookup_model, model_tree, bpd_neural) take from MethodOptions:
one reading, so each refuses a missing draft or one with its own tokenizer the same way."""

from __future__ import annotations

from ..backends.lean_draft import draft_backend
from ..errors import DraftVerifyError
from .model import require_shared_vocabulary


def draft_model_backend(options, drafter: str, why: str | None = None):
    """options.draft_model as the drafter's backend (the lean one where options allow it). DraftVerifyError when
    there is none (`why` says what the drafter needs it for; default: that it needs one) or when it has its own
    tokenizer (these drafters read its probabilities over the target's vocabulary)."""
    if options.draft_model is None:
        need = why or f"the {drafter!r} drafter needs a draft model"
        raise DraftVerifyError(f"{need}: pass draft=... (CLI: --draft PATH)")
    require_shared_vocabulary(options, drafter)
    return draft_backend(options.draft_model, "draft", options.compile, options.lean_draft)

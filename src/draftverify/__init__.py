"""draftverify: draft cheaply, verify with the target in one forward pass.

    from draftverify import generate, load
"""
from . import drafters, verifiers  # noqa: F401  (registers every drafter and verifier)
from .api import Pipeline, load
from .cached_lm import CachedLM
from .errors import DraftVerifyError
from .loop import generate
from .types import Draft, GenerationOutput, GenerationStats, SamplingParams, Verdict

__all__ = [
    "CachedLM",
    "Draft",
    "DraftVerifyError",
    "GenerationOutput",
    "GenerationStats",
    "Pipeline",
    "SamplingParams",
    "Verdict",
    "generate",
    "load",
]
__version__ = "0.1.0"

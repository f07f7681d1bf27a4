"""Input validation shared by the Python API and the CLI. Imports neither torch nor transformers, so the CLI
rejects a bad argument in a fraction of a second instead of after loading them (and never after echoing the
prompt or loading models)."""

from __future__ import annotations

import math

from .errors import DraftVerifyError, check_number


def check_sampling(temperature: object, top_k: object, top_p: object, seed: object, coupling: object) -> None:
    """The rules of SamplingParams (which calls this), so the CLI can apply them before importing torch."""
    check_number("temperature (0 = greedy)", temperature, 0.0)
    if math.isinf(temperature):
        raise DraftVerifyError(
            "temperature must be a finite number >= 0 (0 = greedy; large values flatten the "
            "distribution towards uniform), got inf"
        )
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise DraftVerifyError(f"top_k must be an integer >= 0 (0 = disabled), got {top_k!r}")
    check_number("top_p (1 = disabled)", top_p, 0.0, 1.0, low_open=True)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise DraftVerifyError(f"seed must be an integer (or None for a random seed), got {seed!r}")
    if coupling is not None and not isinstance(coupling, bool):
        raise DraftVerifyError(f"coupling must be True, False or None (= on when seeded), got {coupling!r}")


def gamma_flag(value: str) -> int | str:
    """A --gamma flag's text as parse_gamma takes it: an integer (a negative one too, so its error names the number)
    or the word (auto, conf=0.9, ...), which parse_gamma checks."""
    return int(value) if value.lstrip("-").isdigit() else value


def check_max_new_tokens(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DraftVerifyError(f"max_new_tokens must be an integer >= 1, got {value!r}")
    return value


def check_prompt_text(text: object) -> str:
    """A prompt must be one string (Pipeline.generate takes a list and checks each one) with some text besides
    whitespace: given only spaces or newlines, a model continues nothing the user wrote (the CLI, the API and the
    server all reject it here). A string holding an unpaired surrogate (a non-UTF-8 command-line argument, a broken
    decode) cannot be tokenized."""
    if isinstance(text, (list, tuple)):
        raise DraftVerifyError(
            f"one prompt is expected here, got a list of {len(text)}; Pipeline.generate takes a list and runs it "
            "as one batch"
        )
    if not isinstance(text, str):
        raise DraftVerifyError(f"the prompt must be a str, got {type(text).__name__}")
    if not text:
        raise DraftVerifyError("the prompt is empty: give some text to continue")
    if not text.strip():
        shown = repr(text) if len(text) <= 20 else f"{len(text)} characters"
        raise DraftVerifyError(f"the prompt is only whitespace ({shown}): give some text to continue")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise DraftVerifyError(
            f"the prompt is not valid Unicode text: character {err.start} is an unpaired surrogate "
            f"({text[err.start]!r}), which is what non-UTF-8 bytes on a command line or a lossy decode produce; "
            "pass UTF-8 text"
        ) from None
    return text


def decode_prompt_bytes(data: bytes, source: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DraftVerifyError(
            f"the prompt from {source} is not UTF-8 (byte {err.start} is {data[err.start]:#04x}); pass UTF-8 text"
        ) from None

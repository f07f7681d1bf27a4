"""What a row's logits go through before they are judged, as a user states it: penalties, a logit bias, when the row
may stop, and structured output (a JSON schema, any JSON object, a regex, a grammar, a choice of strings).

The settings are plain data (no torch): `Processing` per row, `Structured` for the constraint on the text. The loop's
logits processors (engine/processors.py) apply them at every position a verify pass scores, each position with the
tokens it follows, so a row decodes exactly as the target alone decodes under the same settings; structured.py
compiles a `Structured` for one tokenizer (xgrammar, the `structured` extra).

Semantics are vLLM's (and OpenAI's where it defines the field): repetition_penalty counts the prompt and the
generated tokens, presence / frequency penalties the generated tokens only; logit_bias is added first, then the
penalties (repetition: a positive logit divided, a negative one multiplied; then frequency x count and presence
subtracted), then temperature / top-k / top-p. min_tokens forbids the row's stop tokens (EOS unless ignore_eos, and
stop_token_ids) until that many tokens are out; stop_token_ids end the row like EOS.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from .errors import DraftVerifyError

BIAS_LIMIT = 100.0  # OpenAI's logit_bias range: -100 (never, in effect) .. 100 (only this token, in effect)
PENALTY_LIMIT = 2.0  # OpenAI's presence / frequency penalty range
# repetition_penalty's range: vLLM takes any positive factor, but a logit divided by 1e-300 is no number any more
REPETITION_LIMITS = (0.01, 100.0)


class ProcessingError(DraftVerifyError):
    """A processing setting draftverify cannot take; `field` names it (presence_penalty, logit_bias, regex, ...)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.reason = message


def _number(field: str, value: object, low: float, high: float, *, low_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ProcessingError(field, f"must be a finite number, got {value!r}")
    if (value <= low if low_open else value < low) or value > high:
        span = ("(" if low_open else "[") + f"{low:g}, " + (f"{high:g}]" if math.isfinite(high) else "inf)")
        raise ProcessingError(field, f"must be in {span}, got {value!r}")
    return float(value)


def _token_id(field: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ProcessingError(field, f"token ids are integers >= 0, got {value!r}")
    return value


STRUCTURED_KINDS = ("json_schema", "json_object", "regex", "grammar", "choice")


@dataclass(frozen=True)
class Structured:
    """The text a row may produce, one of: json_schema (a JSON Schema, as a dict or its JSON text), json_object
    (True: any JSON object), regex, grammar (EBNF as xgrammar and llama.cpp's GBNF write it: `root ::= ...`), choice
    (one of these strings). any_whitespace False: JSON without free whitespace between its tokens (vLLM's
    disable_any_whitespace), which small models need lest they fill the answer with newlines."""

    json_schema: Any = None
    json_object: bool = False
    regex: str | None = None
    grammar: str | None = None
    choice: tuple[str, ...] | None = None
    any_whitespace: bool = True

    def __post_init__(self) -> None:
        given = [name for name in STRUCTURED_KINDS if getattr(self, name) not in (None, False)]
        if len(given) != 1:
            raise ProcessingError(
                "structured",
                "give exactly one of json_schema, json_object, regex, grammar, choice"
                + (f" (got {', '.join(given)})" if given else ""),
            )
        if self.json_object is not False and self.json_object is not True:
            raise ProcessingError("json_object", f"must be True or False, got {self.json_object!r}")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ProcessingError(name, f"must be a string, got {type(value).__name__}")
        if self.choice is not None:
            if isinstance(self.choice, str) or not all(isinstance(c, str) for c in self.choice) or not self.choice:
                raise ProcessingError("choice", "must be a non-empty list of strings")
            object.__setattr__(self, "choice", tuple(self.choice))
        if self.json_schema is not None:
            object.__setattr__(self, "json_schema", _schema_text(self.json_schema))
        if not isinstance(self.any_whitespace, bool):
            raise ProcessingError("any_whitespace", f"must be True or False, got {self.any_whitespace!r}")

    @property
    def kind(self) -> str:
        """Which constraint this is (a name in STRUCTURED_KINDS)."""
        return next(name for name in STRUCTURED_KINDS if getattr(self, name) not in (None, False))


def _schema_text(schema: object) -> str:
    """A JSON schema as compact JSON text (a hashable key for the compiler's cache)."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as err:
            raise ProcessingError("json_schema", f"is not valid JSON: {err}") from None
    if not isinstance(schema, (dict, bool)):
        raise ProcessingError("json_schema", f"must be a JSON object (a dict), got {type(schema).__name__}")
    return json.dumps(schema, separators=(",", ":"))  # the order of its properties is the order they are written


@dataclass(frozen=True)
class Processing:
    """One row's logits processing (see the module). The defaults change nothing.

    structured: a `Structured` constraint, compiled for the target's tokenizer before decoding (Pipeline does it;
    loop.generate takes the compiled grammar, structured.compile)."""

    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: Mapping[int, float] | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    structured: Any = None  # Structured, or its compiled form (structured.Grammar)
    _bias: tuple[tuple[int, float], ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            _number(name, getattr(self, name), -PENALTY_LIMIT, PENALTY_LIMIT)
        _number("repetition_penalty", self.repetition_penalty, *REPETITION_LIMITS)
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, Mapping):
                raise ProcessingError("logit_bias", f"must map token ids to biases, got {self.logit_bias!r}")
            bias = tuple(
                (_token_id("logit_bias", t), _number("logit_bias", b, -BIAS_LIMIT, BIAS_LIMIT))
                for t, b in self.logit_bias.items()
            )
            object.__setattr__(self, "_bias", bias)
        if isinstance(self.min_tokens, bool) or not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise ProcessingError("min_tokens", f"must be an integer >= 0, got {self.min_tokens!r}")
        if not isinstance(self.ignore_eos, bool):
            raise ProcessingError("ignore_eos", f"must be True or False, got {self.ignore_eos!r}")
        if isinstance(self.stop_token_ids, (str, bytes)) or not hasattr(self.stop_token_ids, "__iter__"):
            raise ProcessingError("stop_token_ids", f"must be a list of token ids, got {self.stop_token_ids!r}")
        object.__setattr__(self, "stop_token_ids", tuple(_token_id("stop_token_ids", t) for t in self.stop_token_ids))

    @property
    def bias(self) -> tuple[tuple[int, float], ...]:
        """logit_bias as (token id, bias) pairs, checked."""
        return self._bias

    @property
    def penalized(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    def check_vocabulary(self, vocab_size: int) -> None:
        """Every token id named is one the model has (logits [0, vocab_size))."""
        for name, ids in (("logit_bias", [t for t, _ in self.bias]), ("stop_token_ids", self.stop_token_ids)):
            wrong = [t for t in ids if t >= vocab_size]
            if wrong:
                raise ProcessingError(name, f"token id {wrong[0]} is not in this model's vocabulary [0, {vocab_size})")

    def stops(self, eos: set[int]) -> set[int]:
        """The tokens that end this row: EOS (unless ignore_eos) and stop_token_ids."""
        return (set() if self.ignore_eos else set(eos)) | set(self.stop_token_ids)


PLAIN = Processing()  # a row without processing

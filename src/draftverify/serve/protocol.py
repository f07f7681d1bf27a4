"""OpenAI request bodies (the fields draftverify serves) and OpenAI-style error bodies.

Unknown fields are rejected (extra="forbid") rather than silently ignored: a client that asks for tools should
hear that it will not get them. Fields OpenAI defines that we cannot honour are accepted only at their neutral
value (best_of below n, or above it streamed, is a 400).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictInt, WithJsonSchema

from ..processing import BIAS_LIMIT, PENALTY_LIMIT, REPETITION_LIMITS


class ApiError(Exception):
    """An error answered as OpenAI does: {"error": {"message", "type", "param", "code"}} with an HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


STRICT = ConfigDict(extra="forbid", strict=True)  # no coercion: "5" is not a max_tokens, as the schema says

MAX_LOGPROBS = 5  # completions' logprobs, as OpenAI's legacy completions cap it
MAX_TOP_LOGPROBS = 20  # chat's top_logprobs, as OpenAI caps it
GAMMA_NAMES = r"auto|heuristic|conf(=(0(\.[0-9]+)?|1(\.0+)?))?"  # the named draft lengths a request may give
SEED_LIMIT = 2**53 - 1  # the integers a JSON number holds exactly (a double), whichever client parses it
MAX_CHOICES = 128  # n, as OpenAI bounds it (a server's document says less where --max-queue holds fewer rows)


def _whole(value: Any) -> Any:
    """A number with no fraction (2.0) is an integer, as JSON Schema counts (strict mode alone would refuse it)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


Int = Annotated[int, BeforeValidator(_whole)]


def _checked(default: Any = None, **schema: Any) -> Any:
    """A field whose limits the handlers check (with messages of their own) and the schema states: a keyword at
    the top of a field's schema applies to the values of its type (minimum to numbers, maxItems to arrays)."""
    return Field(default=default, json_schema_extra=schema)


_TEXT = {"type": "string", "pattern": r"\S"}  # something besides whitespace
_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}  # token ids (below the vocabulary)
PROMPT_SCHEMA = {
    "anyOf": [
        _TEXT,
        {"type": "array", "items": _TEXT, "minItems": 1, "maxItems": 1},
        _IDS,
        {"type": "array", "items": _IDS, "minItems": 1, "maxItems": 1},
    ],
    "description": "One prompt: a text, token ids, or a list of one of those",
}


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = False


def _int_or_name(value: Any) -> Any:
    """One error for a gamma that is neither (a union's error would name each branch: speculative.gamma.int)."""
    value = _whole(value)
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError("must be an integer draft length or one of 'auto', 'heuristic', 'conf[=T]'")
    return value


class Speculative(BaseModel):
    """Per-request speculative settings, draftverify's extension (the openai client sends it via extra_body):
    which of the server's methods drafts (GET /v1/models lists them), how many tokens, or none at all."""

    model_config = STRICT
    method: Optional[str] = Field(default=None, description="One of this server's methods; default: its --method")
    gamma: Optional[Annotated[Union[StrictInt, str], BeforeValidator(_int_or_name)]] = _checked(
        minimum=1, pattern=f"^({GAMMA_NAMES})$", description="Draft length: an integer, 'auto', 'heuristic', 'conf=T'"
    )
    enabled: StrictBool = Field(default=True, description="false: the target alone, whatever method and gamma say")


# ---- structured output: OpenAI's response_format and vLLM's structured_outputs ------------------------------------
TOKEN_ID = r"^(0|[1-9][0-9]*)$"  # a token id as a JSON object's key


def _structured_schema(schema: dict) -> None:
    """StructuredOutputs' schema: exactly one kind of constraint, and no null default (a field left out is absent,
    and null is no value the fields take)."""
    for prop in schema.get("properties", {}).values():
        if prop.get("default", 0) is None:
            del prop["default"]
    schema["oneOf"] = [{"required": [name]} for name in STRUCTURED_FIELDS]


class TextFormat(BaseModel):
    model_config = STRICT
    type: Literal["text"]


class JsonObjectFormat(BaseModel):
    model_config = STRICT
    type: Literal["json_object"]


class JsonSchemaSpec(BaseModel):
    model_config = STRICT
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: Optional[str] = None
    schema_: dict[str, Any] = Field(alias="schema", description="The JSON Schema the answer follows")
    strict: Optional[bool] = None


class JsonSchemaFormat(BaseModel):
    model_config = STRICT
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[Union[TextFormat, JsonObjectFormat, JsonSchemaFormat], Field(discriminator="type")]

STRUCTURED_FIELDS = ("json", "regex", "choice", "grammar", "json_object")


class StructuredOutputs(BaseModel):
    """vLLM's structured_outputs: exactly one of json (a JSON Schema), regex, choice, grammar (EBNF / GBNF) or
    json_object; disable_any_whitespace: JSON without free whitespace between tokens."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=_structured_schema)
    json_: Union[dict[str, Any], str] = Field(default=None, alias="json")  # type: ignore[assignment]
    regex: str = None  # type: ignore[assignment]
    choice: list[str] = Field(default=None, min_length=1)  # type: ignore[arg-type]
    grammar: str = None  # type: ignore[assignment]
    json_object: Literal[True] = None  # type: ignore[assignment]
    disable_any_whitespace: StrictBool = False


# response_format asking for JSON and structured_outputs together: a 400 (the schema says so)
BOTH_CONSTRAINTS: dict[str, Any] = {
    "required": ["response_format", "structured_outputs"],
    "properties": {
        "response_format": {"type": "object", "properties": {"type": {"enum": ["json_object", "json_schema"]}}},
        "structured_outputs": {"type": "object"},
    },
}


class _Sampling(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model_config = ConfigDict(**STRICT, json_schema_extra={"not": BOTH_CONSTRAINTS})

    model: str
    max_tokens: Optional[Int] = _checked(minimum=1)
    temperature: Optional[float] = _checked(minimum=0, maximum=2)  # OpenAI's default is 1
    top_p: Optional[float] = _checked(exclusiveMinimum=0, maximum=1)
    top_k: Optional[Int] = _checked(minimum=-1)  # not OpenAI's; vLLM's extension (-1 or 0: off)
    n: Optional[Int] = _checked(
        minimum=1, maximum=MAX_CHOICES, description="Choices to generate, each sampled with seed + its index"
    )
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    stop: Optional[Union[str, list[str]]] = _checked(maxItems=4)
    seed: Optional[Int] = _checked(minimum=-SEED_LIMIT, maximum=SEED_LIMIT)
    user: Optional[str] = None
    speculative: Optional[Speculative] = None
    # logits processing and structured output (processing.py; the handlers check them: Service.processing_for)
    presence_penalty: Optional[float] = _checked(minimum=-PENALTY_LIMIT, maximum=PENALTY_LIMIT)
    frequency_penalty: Optional[float] = _checked(minimum=-PENALTY_LIMIT, maximum=PENALTY_LIMIT)
    logit_bias: Optional[dict[str, float]] = _checked(
        propertyNames={"pattern": TOKEN_ID},  # the server narrows it to its vocabulary (server_openapi)
        additionalProperties={"type": "number", "minimum": -BIAS_LIMIT, "maximum": BIAS_LIMIT},
        description="Token id (as a string) -> bias in [-100, 100], added to its logit",
    )
    repetition_penalty: Optional[float] = _checked(
        minimum=REPETITION_LIMITS[0],
        maximum=REPETITION_LIMITS[1],
        description="vLLM's: > 1 penalises tokens of the prompt and the output (1: off)",
    )
    min_tokens: Optional[Int] = _checked(minimum=0, description="No stop token (EOS, stop_token_ids) before this many")
    ignore_eos: Optional[StrictBool] = Field(default=None, description="Go on past EOS (up to max_tokens)")
    stop_token_ids: Optional[list[Int]] = _checked(items={"type": "integer", "minimum": 0})
    response_format: Optional[ResponseFormat] = None
    structured_outputs: Optional[StructuredOutputs] = None


class CompletionRequest(_Sampling):
    # logprobs and "heal": true, not both (healing re-tokenizes the prompt's end)
    model_config = ConfigDict(
        **STRICT,
        json_schema_extra={
            "not": {
                "required": ["logprobs", "heal"],
                "properties": {"logprobs": {"type": "integer"}, "heal": {"const": True}},
            }
        },
    )

    # the handler checks the prompt (its messages say what is wrong); the schema states the same rules
    prompt: Annotated[Union[str, list[str], list[Int], list[list[Int]]], WithJsonSchema(PROMPT_SCHEMA)]
    echo: Optional[bool] = False
    best_of: Optional[Int] = _checked(
        minimum=1,
        maximum=MAX_CHOICES,
        description="Candidates the n choices are the best of, by the cumulative log-probability of their tokens: at "
        "least n (the default, every candidate returned); above n not with stream",
    )
    logprobs: Optional[Int] = _checked(
        minimum=0,
        maximum=MAX_LOGPROBS,
        description="Log-probabilities of the answer's tokens (and, with echo, the prompt's) with this many most "
        "likely tokens at each position",
    )
    suffix: Optional[str] = _checked(maxLength=0)
    heal: Optional[StrictBool] = None  # not OpenAI's: token healing for this request (default: the server's --heal)


class TextPart(BaseModel):
    model_config = STRICT
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = STRICT
    role: Literal["system", "developer", "user", "assistant"]
    content: Union[str, list[TextPart], None] = None
    name: Optional[str] = None


class ChatRequest(_Sampling):
    # max_tokens or max_completion_tokens, not both; top_logprobs above 0 only with logprobs true; one constraint on
    # the text (as _Sampling says)
    model_config = ConfigDict(
        **STRICT,
        json_schema_extra={
            "allOf": [
                {"not": {"required": ["max_tokens", "max_completion_tokens"]}},
                {
                    "not": {
                        "required": ["top_logprobs"],
                        "properties": {
                            "top_logprobs": {"type": "integer", "minimum": 1},
                            "logprobs": {"not": {"const": True}},
                        },
                    }
                },
                {"not": BOTH_CONSTRAINTS},
            ]
        },
    )

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[Int] = _checked(minimum=1)
    logprobs: Optional[bool] = Field(default=None, description="Log-probabilities of the answer's tokens")
    top_logprobs: Optional[Int] = _checked(
        minimum=0, maximum=MAX_TOP_LOGPROBS, description="The most likely tokens listed at each position"
    )
    # tools / functions / tool_choice are unknown fields: a 400 that names them


# ---- response bodies (what /openapi.json declares; the handlers' dicts are validated against them) ----------------


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: Optional[str] = None  # the request field at fault, dotted (speculative.gamma, messages.0.role)
    code: Optional[str] = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int = Field(
        description="The answer's tokens up to the one that ended it (the token that completed a stop string, the "
        "EOS, the max_tokens-th), whatever the speculation drafted past it; summed over the choices"
    )
    total_tokens: int
    # draftverify's extension: what speculation did for this request
    drafted_tokens: int = Field(description="Draft tokens proposed for this request")
    accepted_tokens: int = Field(description="Draft tokens the target kept (and that were emitted)")
    target_calls: int = Field(description="Target forwards this request took part in (after its prompt)")


FinishReason = Optional[Literal["stop", "length"]]


class CompletionLogprobs(BaseModel):
    """Per token of the choice's text (the prompt's first when echoed): its text, log-probability (null for the
    prompt's first token, which nothing scores), most likely tokens with theirs, and where its text starts."""

    tokens: list[str]
    token_logprobs: list[Optional[float]]
    top_logprobs: list[Optional[dict[str, float]]]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    text: str
    index: int
    logprobs: Optional[CompletionLogprobs] = None
    finish_reason: FinishReason


class Completion(BaseModel):
    """A /v1/completions answer; streamed, each `data:` line is one with a piece of the text (usage null, and
    with stream_options.include_usage a last chunk with no choices and the usage)."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Optional[Usage] = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: Optional[list[int]] = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: Optional[list[ChatTokenLogprob]] = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: Optional[ChatLogprobs] = None
    finish_reason: FinishReason


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: Optional[int] = None
    speculative_methods: list[str] = Field(description="What a request's speculative.method may name")


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["ok"]
    model: str
    pid: int
    queued: int
    running_rows: int
    max_queue: int
    max_batch: int


class Unavailable(BaseModel):
    status: Literal["unavailable"]

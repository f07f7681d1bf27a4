"""OpenAI request bodies (the fields draftverify serves) and OpenAI-style error bodies.

Unknown fields are rejected (extra="forbid") rather than silently ignored: a client that asks for logprobs or
tools should hear that it will not get them. Fields OpenAI defines that we cannot honour are accepted only at
their neutral value (n=1, best_of=1, penalties 0, no logit_bias, no logprobs), anything else is a 400.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictInt


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


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


def _int_or_name(value: Any) -> Any:
    """One error for a gamma that is neither (a union's error would name each branch: speculative.gamma.int)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError("must be an integer draft length or one of 'auto', 'heuristic', 'conf[=T]'")
    return value


class Speculative(BaseModel):
    """Per-request speculative settings, draftverify's extension (the openai client sends it via extra_body):
    which of the server's methods drafts (GET /v1/models lists them), how many tokens, or none at all."""

    model_config = ConfigDict(extra="forbid")
    method: Optional[str] = None  # default: the server's --method
    gamma: Optional[Annotated[Union[StrictInt, str], BeforeValidator(_int_or_name)]] = None  # or "auto", "conf=T"
    enabled: StrictBool = True  # false: the target alone (autoregressive), whatever method and gamma say


class _Sampling(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model_config = ConfigDict(extra="forbid")

    model: str
    max_tokens: Optional[int] = None
    temperature: Optional[float] = None  # OpenAI's default is 1
    top_p: Optional[float] = None
    top_k: Optional[int] = None  # not OpenAI's; vLLM's extension (the openai client sends it via extra_body)
    n: Optional[int] = None
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    stop: Optional[Union[str, list[str]]] = None
    seed: Optional[int] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    logit_bias: Optional[dict[str, float]] = None
    user: Optional[str] = None
    speculative: Optional[Speculative] = None


class CompletionRequest(_Sampling):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    echo: Optional[bool] = False
    best_of: Optional[int] = None
    logprobs: Optional[int] = None
    suffix: Optional[str] = None
    heal: Optional[StrictBool] = None  # not OpenAI's: token healing for this request (default: the server's --heal)


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant"]
    content: Union[str, list[TextPart], None] = None
    name: Optional[str] = None


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[int] = None
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = None
    response_format: Optional[dict[str, Any]] = None
    # tools / functions / tool_choice are unknown fields: a 400 that names them

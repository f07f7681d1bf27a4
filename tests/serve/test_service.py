"""The Service's checks without HTTP: the context window (the smaller of the target's and the draft model's) and
the server's max_tokens limit decide a request's max_tokens, and what they rule out is an OpenAI-style ApiError."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from draftverify.serve.app import ServerSettings, Service
from draftverify.serve.protocol import ApiError, CompletionRequest


def _service(max_tokens_limit: int | None = None) -> Service:
    pipe = SimpleNamespace(
        tokenizer=SimpleNamespace(),
        target=SimpleNamespace(max_positions=64, vocab_size=100),
        drafter=SimpleNamespace(models=lambda: [SimpleNamespace(lm=SimpleNamespace(max_positions=32))]),
        eos_token_id=0,
        method=SimpleNamespace(name="model"),
        gamma=4,
    )
    return Service(pipe, ServerSettings(model_name="m", max_tokens_limit=max_tokens_limit))


def _body(**fields) -> CompletionRequest:
    return CompletionRequest(**{"model": "m", "prompt": [1, 2, 3], **fields})


def test_max_tokens_defaults_to_the_room_left_then_the_server_limit():
    assert _service().window == 32
    params, max_tokens, stop = _service().check_common(_body(stop="\n", temperature=0), None, 20)
    assert (max_tokens, stop, params.temperature) == (12, ["\n"], 0)
    assert _service(max_tokens_limit=5).check_common(_body(), None, 20)[1] == 5


@pytest.mark.parametrize(
    "body, max_tokens, prompt_tokens, status, param, code",
    [
        (_body(model="other"), 4, 3, 404, "model", "model_not_found"),
        (_body(), 30, 3, 400, "max_tokens", "context_length_exceeded"),
        (_body(), None, 32, 400, "prompt", "context_length_exceeded"),
        (_body(top_p=0), 4, 3, 400, "top_p", None),
        (_body(stop=["a", "b", "c", "d", "e"]), 4, 3, 400, "stop", None),
    ],
)
def test_what_the_checks_rule_out_is_an_api_error(body, max_tokens, prompt_tokens, status, param, code):
    with pytest.raises(ApiError) as caught:
        _service().check_common(body, max_tokens, prompt_tokens)
    assert (caught.value.status, caught.value.param, caught.value.code) == (status, param, code)


def test_prompt_token_ids_must_be_in_the_vocabulary():
    with pytest.raises(ApiError, match=r"in \[0, 100\)"):
        _service().completion_prompt(_body(prompt=[1, 100]))

"""The Service's checks without HTTP: the context window (the smaller of the target's and the draft model's) and
the server's max_tokens limit decide a request's max_tokens, and what they rule out is an OpenAI-style ApiError;
the methods a server offers per request, and a request's `speculative` field checked against them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from draftverify.serve.app import ServerSettings, Service
from draftverify.serve.protocol import ApiError, CompletionRequest, Speculative
from draftverify.serve.speculation import Methods, Speculation


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


def test_a_server_without_a_draft_model_offers_the_model_free_methods():
    from conftest import build_model
    from draftverify.api import Pipeline
    from draftverify.serve.speculation import runnable_methods

    pipe = Pipeline(build_model("llama"), None, "prompt_lookup")
    methods = runnable_methods(pipe)
    assert list(methods)[0] == "prompt_lookup" and methods["prompt_lookup"] is pipe
    assert {"autoregressive", "prompt_lookup_tree", "early_exit"} <= set(methods)
    assert not {"model", "lookup_model", "model_tree", "bild", "bpd", "ngram"} & set(methods)  # pieces not loaded
    assert all(p.target is pipe.target for p in methods.values())  # one loaded target for every method


def _methods() -> Methods:
    window_of = {"model": 32, "autoregressive": 32, "prompt_lookup": None}
    pipes = {
        name: SimpleNamespace(target=SimpleNamespace(max_positions=w), drafter=SimpleNamespace(models=lambda: []))
        for name, w in window_of.items()
    }
    return Methods(pipes, "model", 4)


@pytest.mark.parametrize(
    "speculative, expected",
    [
        (None, Speculation("model", 4)),
        ({"gamma": 7}, Speculation("model", 7)),
        ({"method": "prompt_lookup", "gamma": "conf=0.5"}, Speculation("prompt_lookup", "conf=0.5")),
        ({"enabled": False, "method": "prompt_lookup", "gamma": 2}, Speculation("autoregressive", 4)),
        ({"method": "autoregressive", "gamma": 9}, Speculation("autoregressive", 4)),  # one batch for all of them
    ],
)
def test_a_request_runs_the_method_and_gamma_it_names(speculative, expected):
    spec = None if speculative is None else Speculative(**speculative)
    assert _methods().resolve(spec) == expected


@pytest.mark.parametrize(
    "speculative, param, allowed",
    [
        ({"method": "bild"}, "speculative.method", "model, autoregressive, prompt_lookup"),
        ({"gamma": 32}, "speculative.gamma", "1..31"),  # the model's context leaves room for 31
        ({"method": "prompt_lookup", "gamma": 65}, "speculative.gamma", "1..64"),
        ({"gamma": "auto\n"}, "speculative.gamma", "'conf=T'"),
        ({"gamma": "conf=2"}, "speculative.gamma", "'conf=T'"),
    ],
)
def test_what_a_request_may_not_name_is_a_400_naming_the_field(speculative, param, allowed):
    with pytest.raises(ApiError) as caught:
        _methods().resolve(Speculative(**speculative))
    assert (caught.value.status, caught.value.param) == (400, param) and allowed in caught.value.message

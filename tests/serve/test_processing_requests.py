"""The server's logits processing and structured output fields: presence / frequency / repetition penalties,
logit_bias, min_tokens, ignore_eos, stop_token_ids, response_format (json_object, json_schema) and vLLM's
structured_outputs (json, regex, choice, grammar, json_object), on /v1/completions and /v1/chat/completions. Each
answer equals the library's under the same settings and the target alone's (speculation off); a JSON schema's answer
parses and validates, on the hf and the llamacpp backend; a bad value is a 400 naming its field."""

from __future__ import annotations

import json
import re

import httpx
import openai
import pytest
from serve_fixtures import InProcessServer, make_models

from draftverify import Processing, Structured
from draftverify.api import load
from draftverify.serve.app import ServerSettings, create_app

xgrammar = pytest.importorskip(
    "xgrammar", reason="the structured extra is not installed (pip install -e '.[structured]')"
)

PROMPT = "def quicksort(xs):\n    "
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z]{1,10}$"},
        "ok": {"type": "boolean"},
        "size": {"enum": ["S", "M", "L"]},
    },
    "required": ["name", "ok", "size"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A server on tiny random models (the zoo's tokenizer, a chat template) and its pipeline."""
    models = make_models(tmp_path_factory.mktemp("processing-models"))
    pipe = load(target=models / "target", draft=models / "draft", method="model", gamma=4)
    server = InProcessServer(create_app(pipe, ServerSettings(model_name="tiny", max_batch=4)))
    yield server, pipe
    server.stop()


def complete(server, **fields) -> dict:
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 24, "temperature": 0, **fields}
    reply = httpx.post(server.base + "/v1/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_penalties_bias_and_stop_tokens_equal_the_library_and_the_target_alone(tiny):
    server, pipe = tiny
    plain = complete(server)["choices"][0]["text"]
    made = pipe.generate(PROMPT, max_new_tokens=24).output.new_tokens[0].tolist()  # the plain answer's ids
    assert pipe.tokenizer.decode(made) == plain
    favoured, banned = made[2], made[0]
    fields = {
        "presence_penalty": 0.5,
        "frequency_penalty": 0.5,
        "repetition_penalty": 1.3,
        "logit_bias": {str(favoured): 2.0, str(banned): -100},
        "min_tokens": 4,
    }
    processing = Processing(
        presence_penalty=0.5,
        frequency_penalty=0.5,
        repetition_penalty=1.3,
        logit_bias={favoured: 2.0, banned: -100},
        min_tokens=4,
    )
    served = complete(server, **fields)["choices"][0]["text"]
    assert served != plain
    assert served == pipe.generate(PROMPT, max_new_tokens=24, processing=processing).text
    assert served == complete(server, speculative={"enabled": False}, **fields)["choices"][0]["text"]
    # a stop token ends the answer where it comes, and is not part of its text (vLLM's stop_token_ids)
    stop = made[3]
    ended = complete(server, stop_token_ids=[stop])
    assert ended["choices"][0]["finish_reason"] == "stop"
    assert ended["choices"][0]["text"] == pipe.tokenizer.decode(made[: made.index(stop)])


def test_ignore_eos_runs_to_max_tokens(tiny):
    server, pipe = tiny
    eos = pipe.tokenizer.eos_token_id
    stopped = complete(server, logit_bias={str(eos): 100})  # EOS first: an empty answer
    assert stopped["choices"][0] == {"text": "", "index": 0, "logprobs": None, "finish_reason": "stop"}
    onward = complete(server, logit_bias={str(eos): 100}, ignore_eos=True, max_tokens=6)
    assert onward["choices"][0] == {"text": "", "index": 0, "logprobs": None, "finish_reason": "length"}
    alone = pipe.generate(PROMPT, max_new_tokens=6, processing=Processing(logit_bias={eos: 100}, ignore_eos=True))
    assert alone.output.new_tokens[0].tolist() == [eos] * 6


def test_structured_outputs_regex_choice_and_grammar(tiny):
    server, _ = tiny
    regex = r"[a-c]{2,5}-[0-9]{1,3}"
    text = complete(server, structured_outputs={"regex": regex})["choices"][0]["text"]
    assert re.fullmatch(regex, text), text
    assert (
        text
        == complete(server, structured_outputs={"regex": regex}, speculative={"enabled": False})["choices"][0]["text"]
    )
    choice = complete(server, structured_outputs={"choice": ["red", "green", "blue"]})["choices"][0]["text"]
    assert choice in ("red", "green", "blue")
    grammar = 'root ::= "x = " digit digit? "\\n"\ndigit ::= [0-9]'
    text = complete(server, structured_outputs={"grammar": grammar})["choices"][0]["text"]
    assert re.fullmatch(r"x = [0-9]{1,2}\n", text), text
    compact = complete(server, structured_outputs={"json": SCHEMA, "disable_any_whitespace": True}, max_tokens=48)
    answer = json.loads(compact["choices"][0]["text"])
    assert set(answer) == {"name", "ok", "size"} and answer["size"] in ("S", "M", "L")


def test_chat_takes_the_fields(tiny):
    server, _ = tiny
    client = openai.OpenAI(base_url=server.base + "/v1", api_key="none", max_retries=0, timeout=120)
    out = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "a colour?"}],
        max_tokens=8,
        temperature=0,
        presence_penalty=1.0,
        logit_bias={"5": -100},
        extra_body={"structured_outputs": {"choice": ["red", "green"]}, "min_tokens": 1, "repetition_penalty": 1.1},
    )
    assert out.choices[0].message.content in ("red", "green")
    out = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "json please"}],
        max_tokens=4,
        response_format={"type": "json_object"},
    )
    assert out.choices[0].message.content.startswith("{")


GRAMMAR = "invalid_grammar"  # the code of a constraint the grammar engine refuses (no schema can tell in advance)
BAD = [
    ({"presence_penalty": 3}, "presence_penalty", "must be in [-2, 2]", None),
    ({"frequency_penalty": -2.5}, "frequency_penalty", "must be in [-2, 2]", None),
    ({"repetition_penalty": 0}, "repetition_penalty", "must be in [0.01, 100]", None),
    ({"logit_bias": {"99999999": 1}}, "logit_bias", "not a token id of this model", None),
    ({"logit_bias": {"x": 1}}, "logit_bias", "not a token id", None),
    ({"logit_bias": {"5": 150}}, "logit_bias", "must be in [-100, 100]", None),
    ({"min_tokens": -1}, "min_tokens", "must be an integer >= 0", None),
    ({"stop_token_ids": [10**7]}, "stop_token_ids", "not in this model's vocabulary", None),
    ({"ignore_eos": "yes"}, "ignore_eos", "invalid value", None),
    ({"structured_outputs": {"regex": "a("}}, "structured_outputs.regex", "structured_outputs.regex:", GRAMMAR),
    ({"structured_outputs": {"grammar": "root ::= "}}, "structured_outputs.grammar", "grammar:", GRAMMAR),
    ({"structured_outputs": {"json": "{nope"}}, "structured_outputs.json", "not valid JSON", GRAMMAR),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs", "exactly one of", None),
    ({"structured_outputs": {}}, "structured_outputs", "exactly one of", None),
    ({"structured_outputs": {"pattern": "a"}}, "structured_outputs.pattern", "unknown field", None),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
        "response_format.json_schema.schema",
        "Unsupported type",
        GRAMMAR,
    ),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema.json_schema", "missing required", None),
    ({"response_format": {"type": "yaml"}}, "response_format", "invalid value", None),
    (
        {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
        "structured_outputs",
        "not both",
        None,
    ),
]


@pytest.mark.parametrize("fields, param, message, code", BAD)
def test_bad_values_are_400s_naming_the_field(tiny, fields, param, message, code):
    server, _ = tiny
    for url, base in (
        ("/v1/completions", {"prompt": PROMPT}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ):
        reply = httpx.post(server.base + url, json={"model": "tiny", "max_tokens": 2, **base, **fields}, timeout=60)
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["param"] == param and message in error["message"] and error["code"] == code, error


def test_the_document_declares_the_fields(tiny):
    server, pipe = tiny
    schemas = httpx.get(server.base + "/openapi.json").json()["components"]["schemas"]
    for name in ("CompletionRequest", "ChatRequest"):
        properties = schemas[name]["properties"]
        for field in (
            "presence_penalty",
            "frequency_penalty",
            "repetition_penalty",
            "logit_bias",
            "min_tokens",
            "ignore_eos",
            "stop_token_ids",
            "response_format",
            "structured_outputs",
        ):
            assert field in properties, (name, field)
        pattern = properties["logit_bias"]["propertyNames"]["pattern"]
        vocab = pipe.target.vocab_size
        assert re.fullmatch(pattern, str(vocab - 1)) and not re.fullmatch(pattern, str(vocab))
        assert properties["stop_token_ids"]["anyOf"][0]["items"]["maximum"] == vocab - 1
    assert schemas["StructuredOutputs"]["oneOf"][0] == {"required": ["json"]}


# ---- a JSON schema's answer parses and validates, on both backends (the zoo's trained model) ----------------------
def schema_answer(pipe) -> None:
    server = InProcessServer(create_app(pipe, ServerSettings(model_name="code", max_batch=2)))
    try:
        client = openai.OpenAI(base_url=server.base + "/v1", api_key="none", max_retries=0, timeout=300)
        fmt = {"type": "json_schema", "json_schema": {"name": "item", "schema": SCHEMA}}
        out = client.completions.create(
            model="code",
            prompt='# a JSON item\nitem = {"name": "cup", "ok": true, "size": "M"}\n# another one\nitem = ',
            max_tokens=64,
            temperature=0,
            extra_body={"response_format": fmt},
        )
        answer = json.loads(out.choices[0].text)
        assert out.choices[0].finish_reason == "stop"
        jsonschema = pytest.importorskip("jsonschema")
        jsonschema.validate(answer, SCHEMA)
        alone = client.completions.create(
            model="code",
            prompt='# a JSON item\nitem = {"name": "cup", "ok": true, "size": "M"}\n# another one\nitem = ',
            max_tokens=64,
            temperature=0,
            extra_body={"response_format": fmt, "speculative": {"enabled": False}},
        )
        assert alone.choices[0].text == out.choices[0].text
    finally:
        server.stop()


def test_a_json_schema_answer_parses_and_validates_on_hf():
    schema_answer(load(zoo="code", method="model", gamma=4))


def test_a_json_schema_answer_parses_and_validates_on_llamacpp(monkeypatch, tmp_path):
    pytest.importorskip("llama_cpp", reason="the llamacpp extra is not installed")
    from draftverify.backends.gguf import converter_available

    if not converter_available():
        pytest.skip("no llama.cpp converter: scripts/fetch_llama_cpp_converter.sh")
    schema_answer(load(zoo="code", method="model", backend="llamacpp", threads=1, gamma=4))


def test_the_python_api_takes_the_same_settings(tiny):
    _, pipe = tiny
    out = pipe.generate(PROMPT, max_new_tokens=16, processing=Processing(structured=Structured(choice=("yes", "no"))))
    assert out.text in ("yes", "no")
    texts = pipe.generate([PROMPT, "import os\n"], max_new_tokens=16, processing=[None, Processing(min_tokens=3)])
    assert texts[0].text == pipe.generate(PROMPT, max_new_tokens=16).text

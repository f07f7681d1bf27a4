"""Per-request speculative settings through the openai client, on a real server process: the `speculative` field
picks the method, the draft length, or no drafting; every setting gives the target's own greedy text, also when
requests with different settings arrive together; bad values are 400s naming the field; the usage's drafted /
accepted / target_calls add up to what /metrics counts."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serve_fixtures import ServerProcess, make_models

from draftverify.api import load

PROMPT = "def quicksort(xs):\n    "
TOKENS = 16


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return make_models(tmp_path_factory.mktemp("serve-speculative"))


@pytest.fixture(scope="module")
def server(models):
    # the draft is the target itself: every draft token is accepted, so what a setting changes shows in the usage
    proc = ServerProcess(
        [
            "--target",
            str(models / "target"),
            "--draft",
            str(models / "target"),
            "--method",
            "model",
            "--gamma",
            "4",
            "--served-model-name",
            "tiny",
            "--max-batch",
            "4",
            "--threads",
            "1",
        ]
    )
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def greedy(models) -> str:
    """The target's own greedy text of PROMPT (the library, the target alone)."""
    return load(target=models / "target", method="autoregressive").generate(PROMPT, max_new_tokens=TOKENS).text


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key="none", max_retries=0, timeout=120)


def complete(client, speculative: dict | None, prompt: str = PROMPT):
    extra = {} if speculative is None else {"speculative": speculative}
    return client.completions.create(model="tiny", prompt=prompt, max_tokens=TOKENS, temperature=0, extra_body=extra)


USAGE = ("prompt_tokens", "completion_tokens", "total_tokens", "drafted_tokens", "accepted_tokens", "target_calls")


def usage(out) -> dict:
    """The usage's counts (the openai client adds OpenAI's own optional fields, None here)."""
    fields = out.usage.model_dump()
    return {key: fields[key] for key in USAGE}


def check_usage_adds_up(u: dict) -> None:
    """Each target call gives a request its accepted drafts and the target's own token, but the last call's own
    token may be cut (the request's max_tokens or EOS)."""
    assert u["completion_tokens"] - u["accepted_tokens"] in (u["target_calls"], u["target_calls"] - 1)
    assert 0 <= u["accepted_tokens"] <= u["drafted_tokens"]


def test_the_server_lists_the_methods_a_request_may_name(client):
    methods = client.models.list().data[0].model_extra["speculative_methods"]
    assert methods[0] == "model"  # the server's own first
    assert {"autoregressive", "prompt_lookup", "model_tree", "suffix"} <= set(methods)
    assert not {"bild", "specdec++"} & set(methods)  # lossy: a request may change the speed, never the text
    assert not {"bpd", "bita", "ngram", "specdec"} & set(methods)  # heads, adapter, table, NAT weights: not loaded


SETTINGS = [
    None,
    {"enabled": False},
    {"method": "autoregressive"},
    {"method": "model", "gamma": 1},
    {"method": "model", "gamma": 6},
    {"gamma": "heuristic"},
    {"method": "prompt_lookup", "gamma": 2},
    {"method": "model_tree"},
    {"method": "lookup_model", "gamma": 3},
    {"method": "suffix", "gamma": 4},  # the cross-request cache, here a per-request choice
    {"method": "model", "enabled": False},
]


def test_every_setting_gives_the_target_greedy_text_also_arriving_together(client, greedy):
    with ThreadPoolExecutor(len(SETTINGS)) as pool:  # at once: batched by setting, other settings wait their turn
        outs = list(pool.map(lambda spec: complete(client, spec), SETTINGS))
    for spec, out in zip(SETTINGS, outs):
        assert out.choices[0].text == greedy, spec
        assert out.usage.completion_tokens == TOKENS
        check_usage_adds_up(usage(out))


def test_enabled_false_is_the_target_alone(client):
    u = usage(complete(client, {"enabled": False}))
    assert u["target_calls"] == u["completion_tokens"] == TOKENS
    assert u["drafted_tokens"] == 0 and u["accepted_tokens"] == 0


def test_gamma_is_the_draft_length_of_each_call(client):
    one, four = usage(complete(client, {"gamma": 1})), usage(complete(client, None))  # the server's gamma: 4
    assert one["drafted_tokens"] == one["target_calls"]  # one draft token per call
    assert four["drafted_tokens"] <= 4 * four["target_calls"]
    # the draft is the target: every draft token is kept, so a call yields gamma + 1 tokens (the last one fewer)
    assert one["target_calls"] == -(-TOKENS // 2)
    assert four["target_calls"] == -(-TOKENS // 5)


def test_the_method_is_the_one_asked_for(client):
    model = usage(complete(client, {"method": "model", "gamma": 2}))
    lookup = usage(complete(client, {"method": "prompt_lookup", "gamma": 2}))
    assert model["target_calls"] == -(-TOKENS // 3)  # the draft model (the target): all of every draft kept
    assert lookup["target_calls"] > model["target_calls"]  # copies from the prompt: a random model rarely repeats it


@pytest.mark.parametrize(
    "speculative, param, allowed",
    [
        ({"method": "bild"}, "speculative.method", "autoregressive"),  # lossy: not offered per request
        ({"method": "bpd"}, "speculative.method", "prompt_lookup"),  # needs trained heads this server lacks
        ({"method": "no_such"}, "speculative.method", "model_tree"),
        ({"gamma": 0}, "speculative.gamma", ">= 1"),
        ({"gamma": 65}, "speculative.gamma", "1..64"),
        ({"method": "prompt_lookup", "gamma": 1000}, "speculative.gamma", "1..64"),
        ({"gamma": "often"}, "speculative.gamma", "auto"),
        ({"gamma": 2.5}, "speculative.gamma", "integer"),
        ({"gamma": True}, "speculative.gamma", "integer"),
        ({"enabled": "no"}, "speculative.enabled", "boolean"),
        ({"n_max": 4}, "speculative.n_max", "unknown field"),
    ],
)
@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_bad_settings_are_a_400_naming_the_field(client, speculative, param, allowed, endpoint):
    with pytest.raises(openai.BadRequestError) as caught:
        if endpoint == "chat":
            client.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=4,
                extra_body={"speculative": speculative},
            )
        else:
            complete(client, speculative)
    error = caught.value.body
    assert error["param"] == param
    assert allowed in error["message"]


def test_chat_takes_the_field_and_reports_usage(client):
    messages = [{"role": "user", "content": "write a sort"}]

    def chat(spec):
        return client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=TOKENS, temperature=0, extra_body={"speculative": spec}
        )

    off, on = chat({"enabled": False}), chat({"method": "model", "gamma": 3})
    assert off.choices[0].message.content == on.choices[0].message.content
    assert usage(off)["target_calls"] == off.usage.completion_tokens
    assert usage(on)["target_calls"] < on.usage.completion_tokens


def test_the_final_stream_chunk_carries_the_same_usage(client):
    whole = usage(complete(client, {"method": "model", "gamma": 3}))
    stream = client.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"speculative": {"method": "model", "gamma": 3}},
    )
    chunks = list(stream)
    assert chunks[-1].choices == [] and usage(chunks[-1]) == whole
    chat = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"speculative": {"enabled": False}},
    )
    last = usage(list(chat)[-1])
    assert last["target_calls"] == last["completion_tokens"] and last["drafted_tokens"] == 0


def metrics(server) -> dict[tuple, float]:
    """/metrics as {(sample name, labels): value}."""
    text = httpx.get(server.base + "/metrics").text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def delta(before: dict, after: dict, name: str, **labels: str) -> float:
    """How much the samples called `name` (with these labels, if given) grew."""
    return sum(
        value - before.get(key, 0.0)
        for key, value in after.items()
        if key[0] == name and set(labels.items()) <= set(key[1])
    )


def test_usage_adds_up_to_the_metrics(server, client):
    before = metrics(server)
    outs = [
        complete(client, spec)
        for spec in ({"enabled": False}, {"gamma": 2}, None, {"method": "prompt_lookup"}, {"method": "model_tree"})
    ]
    after = metrics(server)
    total = {key: sum(usage(out)[key] for out in outs) for key in USAGE}
    assert total["accepted_tokens"] > 0
    assert delta(before, after, "draftverify_drafted_tokens_total") == total["drafted_tokens"]
    assert delta(before, after, "draftverify_accepted_tokens_total") == total["accepted_tokens"]
    assert delta(before, after, "draftverify_accepted_by_position_total") == total["accepted_tokens"]
    assert delta(before, after, "draftverify_tokens_per_target_call_count") == total["target_calls"]
    assert delta(before, after, "draftverify_tokens_per_target_call_sum") == total["completion_tokens"]
    assert delta(before, after, "draftverify_target_calls_total") == total["target_calls"]  # one request at a time
    by_position = [delta(before, after, "draftverify_accepted_by_position_total", position=str(p)) for p in (1, 2, 3)]
    assert by_position[0] > 0
    assert by_position == sorted(by_position, reverse=True)  # a draft token is kept only after those before it

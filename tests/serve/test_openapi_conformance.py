"""The server against its own OpenAPI document: schemathesis (the property-based API tester) generates requests
for every operation from /openapi.json, valid and invalid, sends them to a live server on loopback and checks each
answer: no server error, every status, content type, header and body as the document declares, valid requests
accepted, invalid ones refused, unsupported methods answered 405 with an Allow header. Bounded examples, a fixed
seed: the same run every time."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from serve_fixtures import InProcessServer, make_models

from draftverify.api import load
from draftverify.serve.app import ServerSettings, create_app

CHECKS = Path(__file__).with_name("schemathesis_checks.py")
EXAMPLES = 30  # per operation and phase: the run stays well under a minute on two cores


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    models = make_models(tmp_path_factory.mktemp("openapi-models"))
    pipe = load(target=models / "target", draft=models / "draft", method="model", gamma=4)
    # a low max_tokens limit keeps each generated request cheap; the document states it (max_tokens' maximum)
    app = create_app(pipe, ServerSettings(model_name="tiny", max_batch=4, max_tokens_limit=4))
    proc = InProcessServer(app)
    yield proc
    proc.stop()


def test_the_document_declares_bodies_statuses_and_this_servers_limits(server):
    doc = httpx.get(server.base + "/openapi.json").json()
    completions = doc["paths"]["/v1/completions"]["post"]
    assert completions["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/CompletionRequest"
    }
    assert set(completions["responses"]) == {"200", "400", "401", "404", "429", "500", "503"}
    assert set(completions["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
    assert "422" not in json.dumps(doc["paths"])  # a body the models refuse is a 400, as documented
    assert list(doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == ["text/plain"]
    schemas = doc["components"]["schemas"]
    assert schemas["CompletionRequest"]["properties"]["model"]["enum"] == ["tiny"]
    assert schemas["CompletionRequest"]["properties"]["max_tokens"]["maximum"] == 4
    assert {"drafted_tokens", "accepted_tokens", "target_calls"} <= set(schemas["Usage"]["required"])
    speculative = schemas["Speculative"]["properties"]
    assert speculative["method"]["enum"][0] == "model" and "bild" not in speculative["method"]["enum"]


def test_the_document_declares_n_and_best_of(server):
    schemas = httpx.get(server.base + "/openapi.json").json()["components"]["schemas"]
    for request in ("CompletionRequest", "ChatRequest"):
        n = schemas[request]["properties"]["n"]
        assert n["minimum"] == 1 and n["maximum"] == 64  # each choice waits as a row: at most --max-queue of them
        assert "seed + its index" in n["description"]
    best_of = schemas["CompletionRequest"]["properties"]["best_of"]
    assert best_of["minimum"] == 1 and "at least n" in best_of["description"]
    assert "summed over the choices" in schemas["Usage"]["properties"]["completion_tokens"]["description"]


def test_trace_and_other_methods_get_405_with_allow(server):
    r = httpx.request("TRACE", server.base + "/v1/completions")
    assert r.status_code == 405 and r.headers["allow"] == "POST" and r.json()["error"]["message"]
    r = httpx.request("DELETE", server.base + "/metrics")
    assert r.status_code == 405 and "GET" in r.headers["allow"]


def test_schemathesis_finds_nothing(server, tmp_path):
    command = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "run",
        server.base + "/openapi.json",
        "--checks",
        "all",
        "--exclude-checks",
        "positive_data_acceptance",  # valid_data_accepted runs it, save for prompts over the context
        "--max-examples",
        str(EXAMPLES),
        "--seed",
        "34",
        "--workers",
        "1",
        "--output-sanitize",
        "false",
    ]
    run = subprocess.run(
        command,
        cwd=tmp_path,  # its example database goes there
        env={**os.environ, "SCHEMATHESIS_HOOKS": str(CHECKS), "NO_COLOR": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = run.stdout + run.stderr
    assert run.returncode == 0, report[-6000:]
    assert re.search(r"Tested:\s+5\b", report), report[-3000:]  # every operation
    assert "0 failures" in report or "No issues found" in report, report[-3000:]

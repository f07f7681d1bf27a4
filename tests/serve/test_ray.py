"""`draftverify serve --ray`: the same API on Ray Serve with two replicas (skipped when Ray Serve is not installed:
it is the optional extra `ray`)."""

from __future__ import annotations

import os
import signal
import subprocess

import httpx
import openai
import pytest

pytest.importorskip("ray.serve")

from serve_fixtures import ServerProcess, make_models  # noqa: E402

from draftverify.api import load  # noqa: E402


@pytest.fixture(scope="module")
def ray_server(tmp_path_factory):
    models = make_models(tmp_path_factory.mktemp("ray-models"), chat_template=False)
    proc = ServerProcess(
        [
            "--ray",
            "--replicas",
            "2",
            "--threads",
            "1",
            "--target",
            str(models / "target"),
            "--draft",
            str(models / "draft"),
            "--method",
            "model",
            "--served-model-name",
            "tiny",
        ],
        startup_s=240,
    )
    yield proc, models
    proc.stop(interrupt=True)


def test_ray_replicas_serve_the_library_text(ray_server):
    proc, models = ray_server
    client = openai.OpenAI(base_url=proc.base + "/v1", api_key="none", max_retries=0, timeout=120)
    expected = (
        load(target=models / "target", draft=models / "draft", method="model")
        .generate("def f(x):", max_new_tokens=12)
        .text
    )
    texts = {
        client.completions.create(model="tiny", prompt="def f(x):", max_tokens=12, temperature=0).choices[0].text
        for _ in range(4)
    }
    assert texts == {expected}
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(model="tiny", prompt="def f(x):", max_tokens=12, temperature=0, stream=True)
    )
    assert streamed == expected
    health = httpx.get(proc.base + "/health", timeout=30).json()
    assert health["status"] == "ok" and health["model"] == "tiny"


def _replica_pids() -> list[int]:
    """The replicas' worker processes (Ray titles them ray::ServeReplica:<app>:<deployment>)."""
    found = subprocess.run(["pgrep", "-f", "ServeReplica:draftverify"], capture_output=True, text=True).stdout
    return [int(pid) for pid in found.split()]


def test_requests_still_succeed_after_a_replica_is_killed(ray_server):
    """SIGKILL one of the two replica processes (Ray Serve replaces it): requests keep getting the library's text
    (with the openai client's own retries, as a user has them by default)."""
    proc, models = ray_server
    replicas = _replica_pids()
    assert len(replicas) == 2
    os.kill(replicas[0], signal.SIGKILL)
    client = openai.OpenAI(base_url=proc.base + "/v1", api_key="none", max_retries=2, timeout=120)
    expected = (
        load(target=models / "target", draft=models / "draft", method="model")
        .generate("def g(y):", max_new_tokens=8)
        .text
    )
    texts = [
        client.completions.create(model="tiny", prompt="def g(y):", max_tokens=8, temperature=0).choices[0].text
        for _ in range(6)
    ]
    assert texts == [expected] * 6
    assert replicas[0] not in _replica_pids()

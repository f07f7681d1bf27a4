"""hub_unreachable_reason: decided quickly, from the environment or one TCP probe, and remembered briefly."""

from __future__ import annotations

import socket

from draftverify import hub


def test_hf_hub_offline_needs_no_probe(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: (_ for _ in ()).throw(AssertionError("probed")))
    assert hub.hub_unreachable_reason() == "HF_HUB_OFFLINE is set"


def test_a_refused_endpoint_is_unreachable_and_the_answer_is_remembered(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(hub, "_answers", {})
    reason = hub.hub_unreachable_reason()
    assert reason is not None and reason.startswith("127.0.0.1:9")
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: (_ for _ in ()).throw(AssertionError("probed")))
    assert hub.hub_unreachable_reason() == reason


def test_a_listening_endpoint_is_reachable(monkeypatch):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    try:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        monkeypatch.setattr(hub, "_answers", {})
        assert hub.hub_unreachable_reason() is None
    finally:
        server.close()

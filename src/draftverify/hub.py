"""Whether the Hugging Face hub can be reached, decided in about a second, so a hub id on an offline machine
is answered from the local cache (or a clear error) instead of after ~30 s of connection retries."""

from __future__ import annotations

import os
import socket
import time
from urllib.parse import urlparse

_OFF_VALUES = {"1", "on", "yes", "true"}


_ANSWER_SECONDS = 60.0  # one probe serves the tokenizer, config and weights of a load (and of its draft)
_answers: dict[tuple[str, int], tuple[float, str | None]] = {}


def hub_unreachable_reason(timeout: float = 1.5) -> str | None:
    """None when the hub answers a TCP connection; otherwise why not (HF_HUB_OFFLINE set, DNS, refused, ...)."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in _OFF_VALUES:
        return "HF_HUB_OFFLINE is set"
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host = endpoint.hostname or "huggingface.co"
    port = endpoint.port or (80 if endpoint.scheme == "http" else 443)
    asked, answer = _answers.get((host, port), (-_ANSWER_SECONDS, None))
    if time.monotonic() - asked < _ANSWER_SECONDS:
        return answer
    try:
        with socket.create_connection((host, port), timeout=timeout):
            answer = None
    except OSError as err:
        answer = f"{host}:{port}: {err.strerror or type(err).__name__}"
    _answers[(host, port)] = (time.monotonic(), answer)
    return answer

"""A tiny target and draft (random Llamas with the zoo's tokenizer) on disk, and a real server on a loopback port:
a process started once per test module and stopped after it, or an app served by uvicorn in a thread."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import uvicorn
from transformers import AutoTokenizer

import draftverify
from conftest import save_llama
from draftverify.bench.load_test import free_port

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = ROOT / "zoo" / "code" / "tokenizer"
SRC = Path(draftverify.__file__).resolve().parents[1]
API_KEY = "test-key-123"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
CONTEXT = 256


def make_models(root: Path, chat_template: bool = True) -> Path:
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    if chat_template:
        tokenizer.chat_template = CHAT_TEMPLATE
    save_llama(root / "target", layers=2, seed=0, tokenizer=tokenizer, context=CONTEXT)
    save_llama(root / "draft", layers=1, seed=1, tokenizer=tokenizer, context=CONTEXT)
    return root


class ServerProcess:
    def __init__(self, args: list[str], env: dict | None = None, startup_s: float = 120):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        environment = {
            **os.environ,
            "PYTHONPATH": str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            **(env or {}),
        }
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "draftverify.cli",
                "serve",
                "--port",
                str(self.port),
                "--log-level",
                "warning",
                *args,
            ],
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.monotonic() + startup_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}:\n{self.proc.stdout.read()}")
            try:
                if httpx.get(self.base + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the server did not answer /health within {startup_s} s")

    def stop(self, interrupt: bool = False) -> str:
        """SIGTERM, or SIGINT (Ctrl-C: what lets `serve --ray` shut its Ray instance down); SIGKILL if it hangs."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT) if interrupt else self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.stdout.read() if self.proc.stdout else ""


class InProcessServer:
    """An app served by uvicorn on a loopback port, in a thread of this process."""

    def __init__(self, app):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(20)

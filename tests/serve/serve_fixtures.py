"""A tiny target and draft (random Llamas with the zoo's tokenizer) on disk, and a real server process on a
loopback port, started once per test module and stopped after it."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

import draftverify

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = ROOT / "zoo" / "code" / "tokenizer"
SRC = Path(draftverify.__file__).resolve().parents[1]
API_KEY = "test-key-123"
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
CONTEXT = 256


def save_llama(path: Path, layers: int, seed: int, tokenizer) -> None:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=CONTEXT,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)  # peaked logits: varied, deterministic text
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


def make_models(root: Path, chat_template: bool = True) -> Path:
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    if chat_template:
        tokenizer.chat_template = CHAT_TEMPLATE
    save_llama(root / "target", layers=2, seed=0, tokenizer=tokenizer)
    save_llama(root / "draft", layers=1, seed=1, tokenizer=tokenizer)
    return root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, args: list[str], env: dict | None = None, startup_s: float = 120):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        environment = {**os.environ, "PYTHONPATH": str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                       **(env or {})}
        self.proc = subprocess.Popen([sys.executable, "-m", "draftverify.cli", "serve", "--port", str(self.port),
                                      "--log-level", "warning", *args], env=environment,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
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

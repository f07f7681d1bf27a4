"""Fixtures and data for the bench tests: tiny random Llama models (shipped code tokenizer) and a tiny data folder.

A module with a unique name rather than a conftest.py, so the suite's tests/conftest.py stays the only `conftest`
(other tests import helpers from it). Test files import the fixtures they use from here.
"""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from draftverify.drafters import NgramTable

# three HumanEval-like records (the real file lives in ../shared/data; tests do not depend on it)
HUMANEVAL = [
    {
        "task_id": "HumanEval/0",
        "prompt": 'def add(a, b):\n    """Return a + b."""\n',
        "canonical_solution": "    return a + b\n",
        "entry_point": "add",
        "test": "",
    },
    {
        "task_id": "HumanEval/1",
        "prompt": 'def is_even(n):\n    """True when n is even."""\n',
        "canonical_solution": "    return n % 2 == 0\n",
        "entry_point": "is_even",
        "test": "",
    },
    {
        "task_id": "HumanEval/2",
        "prompt": 'def first(xs):\n    """The first item of xs."""\n',
        "canonical_solution": "    return xs[0]\n",
        "entry_point": "first",
        "test": "",
    },
]
SPEC_BENCH = [
    {"question_id": 1, "category": "writing", "turns": ["Write a haiku.", "Now another one."]},
    {
        "question_id": 81,
        "category": "translation",
        "turns": ["Translate German to English: Guten Tag ."],
        "reference": ["Good day ."],
    },
    {"question_id": 82, "category": "translation", "turns": ["Translate German to English: Danke ."]},
    {"question_id": 161, "category": "qa", "turns": ["Who wrote Hamlet?"]},
]


def model_args(model_dir: Path) -> list[str]:
    return [
        "--target",
        str(model_dir / "target"),
        "--draft",
        str(model_dir / "draft"),
        "--aligned-draft",
        str(model_dir / "aligned"),
        "--ngram",
        str(model_dir / "ngram.safetensors"),
    ]


ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = ROOT / "zoo" / "code" / "tokenizer"


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    (root / "humaneval").mkdir()
    with gzip.open(root / "humaneval" / "HumanEval.jsonl.gz", "wt", encoding="utf-8") as handle:
        handle.writelines(json.dumps(r) + "\n" for r in HUMANEVAL)
    (root / "spec_bench").mkdir()
    (root / "spec_bench" / "question.jsonl").write_text("".join(json.dumps(r) + "\n" for r in SPEC_BENCH))
    return root


def _noisy(model, noise: float, seed: int):
    """A draft that often agrees with the target: its weights plus Gaussian noise."""
    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            if p.numel() > 1:
                p.add_(noise * p.std() * torch.randn(p.shape, generator=gen))
    return draft


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    """target (3 layers), draft (noisy copy), aligned (less noisy copy), ngram.safetensors, all float32."""
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    root = tmp_path_factory.mktemp("bench-models")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    target = LlamaForCausalLM(config)
    with torch.no_grad():
        for p in target.parameters():
            p.mul_(3.0)  # peaked logits: varied, deterministic text with clear argmax margins
    for name, model in (("target", target), ("draft", _noisy(target, 0.1, 1)), ("aligned", _noisy(target, 0.03, 2))):
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    ids = tokenizer("def f(x):\n    return x + 1\n" * 3).input_ids
    NgramTable.from_sequences([ids], order=3, vocab_size=len(tokenizer)).save(root / "ngram.safetensors")
    return root

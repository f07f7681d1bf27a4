import gzip
import json
from pathlib import Path

import pytest
from tiny_corpus import write_tiny_corpus

from draftverify.train.tokenizer import (
    EOS_TOKEN,
    TokenizerError,
    build_tokenizer_from_corpus,
    load_tokenizer,
    train_tokenizer,
)

TRICKY = [
    "def f(x):\n    return x\n",
    "class A:\n\tdef g(self):\n\t\tpass\n",  # tabs
    "if x:\r\n    y = 1\r\n",  # CRLF
    "\n\n\nx = 1   \n\n    \n",  # blank lines, trailing spaces
    "s = 'héllo wörld ✓ 中文 🐍'\n",  # non-ASCII
    "        deeply = [\n            1,\n            2,\n        ]\n",
    "  leading spaces",
    "",
    "x = '<|endoftext|>'",
]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tok")
    root = write_tiny_corpus(tmp / "lib", n_files=12)
    info = build_tokenizer_from_corpus(
        tmp / "tokenizer", tmp / "manifest.json", vocab_size=400, root=root, val_fraction=0.3
    )
    assert info["vocab_size"] <= 400
    return tmp / "tokenizer"


def test_files_and_special_tokens(tok_dir):
    for name in ("tokenizer.json", "tokenizer_config.json"):  # transformers 5 keeps special tokens in the config
        assert (tok_dir / name).is_file()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    assert tok.eos_token == tok.bos_token == tok.pad_token == EOS_TOKEN
    assert tok.eos_token_id == tok.convert_tokens_to_ids(EOS_TOKEN) == 0
    assert 256 < len(tok) <= 400
    # the special token is a single id and is not split when written in text
    assert tok(EOS_TOKEN, add_special_tokens=False)["input_ids"] == [tok.eos_token_id]
    # no bos/eos silently added
    ids = tok("x = 1")["input_ids"]
    assert tok.eos_token_id not in ids


@pytest.mark.parametrize("text", TRICKY)
def test_roundtrip(tok_dir, text):
    tok = load_tokenizer(tok_dir)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text


def test_compresses_code(tok_dir):
    tok = load_tokenizer(tok_dir)
    text = "def add(a, b):\n    return a + b\n"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) < len(text.encode()) / 2  # merges learned from the corpus


def test_roundtrip_stdlib_files(tok_dir):
    tok = load_tokenizer(tok_dir)
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for name in ("os.py", "textwrap.py", "json/decoder.py"):
        text = (stdlib / name).read_text(encoding="utf-8")
        assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text


def test_load_errors(tmp_path):
    with pytest.raises(TokenizerError, match="not found"):
        load_tokenizer(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TokenizerError, match="tokenizer.json"):
        load_tokenizer(tmp_path / "empty")
    with pytest.raises(TokenizerError):
        train_tokenizer(["x"], tmp_path / "t", vocab_size=100)


REPO = Path(__file__).resolve().parents[2]
ZOO = REPO / "zoo" / "code" / "tokenizer"


def shipped_python_texts() -> list[str]:
    """Python text the repository itself ships (the corpus the zoo was trained on lives on no other machine):
    HumanEval's prompts and canonical solutions, and this package's own source files."""
    rows = [
        json.loads(line) for line in gzip.open(REPO / "src/draftverify/bench/data/humaneval/HumanEval.jsonl.gz", "rt")
    ]
    sources = sorted((REPO / "src" / "draftverify").rglob("*.py"))
    return [r["prompt"] + r["canonical_solution"] for r in rows[:40]] + [f.read_text() for f in sources[:20]]


def test_zoo_tokenizer_roundtrips_shipped_python():
    tok = load_tokenizer(ZOO)
    assert len(tok) == 8192
    texts = shipped_python_texts() + TRICKY
    assert len(texts) > 60
    for text in texts:
        assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text

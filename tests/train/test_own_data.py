"""`train ... --data PATH`: a user's own text (a folder of text files, or a jsonl) is the corpus the recipes read:
the prompts the target continues come from those files, tokenized with the target's tokenizer; bad data is one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from draftverify.cli import app
from draftverify.train import corpus

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

runner = CliRunner()
ZOO_TOKENIZER = Path(__file__).resolve().parents[2] / "zoo" / "code" / "tokenizer"
TEXTS = {
    "notes.md": "# Notes\n\nThe warehouse ships parcels every Tuesday and Thursday morning.\n" * 6,
    "src/inventory.py": "def restock(shelf, count):\n    shelf.items += count\n    return shelf\n" * 6,
    "src/deep/report.txt": "Quarterly report: revenue grew while the costs of storage fell.\n" * 6,
}


def _write_folder(root: Path) -> Path:
    for name, text in TEXTS.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / "image.bin").write_bytes(bytes(range(256)))  # not a text suffix: left out
    (root / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))  # not UTF-8: left out
    (root / "empty.md").write_text("  \n")
    return root


def test_a_folder_is_read_recursively_by_suffix_with_a_held_out_file(tmp_path):
    m = corpus.data_manifest(_write_folder(tmp_path / "data"))
    assert sorted(f["path"] for f in m["files"]) == sorted(TEXTS)
    assert m["counts"]["val"] >= 1 and m["counts"]["train"] >= 1
    texts = list(corpus.iter_texts(m, "all"))
    assert sorted(texts) == sorted(TEXTS.values())
    assert corpus.load_manifest(tmp_path / "data")["files_sha256"] == m["files_sha256"]


def test_a_jsonl_gives_one_document_a_line(tmp_path):
    path = tmp_path / "data.jsonl"
    lines = [{"text": "alpha beta"}, {"prompt": "Q: two plus two?", "completion": " A: four"}, {"prompt": "only"}]
    path.write_text("\n".join(json.dumps(r) for r in lines) + "\n\n")
    m = corpus.data_manifest(path)
    assert sorted(corpus.iter_texts(m, "all")) == sorted(["alpha beta", "Q: two plus two? A: four", "only"])
    assert {f["path"] for f in m["files"]} == {"data.jsonl:1", "data.jsonl:2", "data.jsonl:3"}


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"text": "fine"}\n{"text": "fine"\n', r"data\.jsonl:2: not a JSON object"),
        ('{"text": "fine"}\n[1, 2]\n', r"data\.jsonl:2: not a JSON object"),
        ('{"body": "x"}\n', r"data\.jsonl:1: no \"text\" field"),
        ('{"text": 3}\n', r"data\.jsonl:1: the text fields must be strings"),
        ('{"text": "  "}\n', r"no lines with text"),
    ],
)
def test_bad_jsonl_lines_are_named(tmp_path, content, message):
    path = tmp_path / "data.jsonl"
    path.write_text(content)
    with pytest.raises(corpus.CorpusError, match=message):
        corpus.data_manifest(path)


def test_missing_empty_and_wrong_kinds_of_data_are_refused(tmp_path):
    with pytest.raises(corpus.CorpusError, match="no such file or folder"):
        corpus.data_manifest(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.bin").write_bytes(b"\0\1")
    with pytest.raises(corpus.CorpusError, match=r"no text files \("):
        corpus.data_manifest(tmp_path / "empty")
    (tmp_path / "one.txt").write_text("text")
    with pytest.raises(corpus.CorpusError, match="give a folder of text files or a .jsonl"):
        corpus.data_manifest(tmp_path / "one.txt")


@pytest.mark.parametrize("command", ["heads", "bita", "nat", "align", "early-exit", "lm", "ngram"])
def test_every_text_recipe_refuses_bad_data_in_one_line(command, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\nnot json\n')
    out = ["--out", str(tmp_path / "o")]
    extra = {"nat": ["--target", "zoo/code/target", *out], "early-exit": ["--layer", "1", *out], "lm": out}
    steps = [] if command == "ngram" else ["--max-steps", "1"]
    result = runner.invoke(app, ["train", command, "--data", str(bad), *steps, *extra.get(command, [])])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [f"error: --data {bad}:2: not a JSON object (Expecting value)"]


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    from transformers import AutoTokenizer

    from conftest import save_llama

    folder = tmp_path_factory.mktemp("own-data") / "target"
    save_llama(folder, layers=2, seed=0, tokenizer=AutoTokenizer.from_pretrained(ZOO_TOKENIZER))
    return folder


def test_heads_learn_from_the_users_files(tiny_target, tmp_path):
    """The prompts the target continues are cut from the given files (their sources name them, their tokens decode
    to those files' text), and the heads train and export."""
    from transformers import AutoTokenizer

    data = _write_folder(tmp_path / "data")
    out = tmp_path / "heads"
    args = ["train", "heads", "--target", str(tiny_target), "--data", str(data), "--out", str(out)]
    args += ["--work-dir", str(tmp_path / "work"), "--num-heads", "2", "--num-prompts", "6", "--eval-prompts", "2"]
    args += ["--min-prompt-tokens", "8", "--max-prompt-tokens", "12", "--new-tokens", "6", "--max-steps", "3"]
    args += ["--no-progress", "--device", "cpu", "--dtype", "bfloat16"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert (out / "heads.safetensors").is_file() and str(data) in (out / "README.md").read_text()
    tok = AutoTokenizer.from_pretrained(tiny_target)
    records = [json.loads(line) for line in (tmp_path / "work" / "generations-train.jsonl").read_text().splitlines()]
    records = [r for r in records if r.get("type") != "header"]
    assert len(records) == 6
    for rec in records:
        name = rec["source"].rsplit(":", 1)[0]
        assert name in TEXTS and tok.decode(rec["prompt"]) in TEXTS[name]

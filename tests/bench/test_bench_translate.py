"""`draftverify bench-translate` on a tiny zoo (random Marian target and small model, an untrained NAT drafter):
every row runs, lossless rows equal AT greedy, the tables and the BiLD plot are written, bad input exits 2."""
from __future__ import annotations

import json

import pytest
import torch
from parallel_corpus import write_parallel_corpus
from typer.testing import CliRunner

from draftverify.bench.prompts import load_prompts
from draftverify.cli import app
from draftverify.drafters import NatDecoder
from draftverify.train.seq2seq import make_config
from draftverify.train.translation_data import train_joint_tokenizer

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny_zoo(tmp_path_factory):
    from transformers import MarianMTModel

    root = tmp_path_factory.mktemp("zoo")
    write_parallel_corpus(root / "data")
    tok_dir = root / "tok"
    train_joint_tokenizer(root / "data" / "multi30k_en_de", tok_dir, vocab_size=300)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    for role, seed in (("target", 0), ("draft", 1)):
        torch.manual_seed(seed)
        model = MarianMTModel(make_config("tiny", len(tok), tok.eos_token_id))
        model.save_pretrained(str(root / "zoo" / "translate" / role))
        tok.save_pretrained(str(root / "zoo" / "translate" / role))
    target = MarianMTModel.from_pretrained(str(root / "zoo" / "translate" / "target"))
    NatDecoder.for_target(target, layers=1, block_size=4).save(root / "zoo" / "translate" / "nat")
    (root / "zoo" / "translate" / "zoo.json").write_text(json.dumps({"default_method": "specdec"}))
    return root


def test_generate_with_the_zoo_translates_with_its_default_method(tiny_zoo, monkeypatch):
    """`generate --zoo translate` runs the zoo's default method (zoo.json) and prints the translation alone: the
    source is not echoed as if it were continued; the same text as the plain target's greedy decoding."""
    monkeypatch.setenv("DRAFTVERIFY_ZOO", str(tiny_zoo / "zoo"))
    args = ["generate", "--zoo", "translate", "--prompt", "a man rides a bike.", "-n", "6", "--json"]
    out = json.loads(CliRunner().invoke(app, args).stdout)
    assert out["method"] == "specdec"
    plain = json.loads(CliRunner().invoke(app, args + ["--method", "autoregressive"]).stdout)
    assert out["text"] == plain["text"]
    streamed = CliRunner().invoke(app, args[:-1])
    assert streamed.exit_code == 0 and not streamed.stdout.startswith("a man rides")


def test_multi30k_prompts_pair_sources_with_references(tiny_zoo):
    prompts = load_prompts("multi30k", tiny_zoo / "data")
    assert len(prompts) == 6 and prompts[0].id == "multi30k/test_2016_flickr/0"
    assert prompts[0].text.endswith(".") and prompts[0].reference.endswith(".")
    assert len(load_prompts("multi30k:val", tiny_zoo / "data")) == 6


def test_bench_translate_runs_every_row(tiny_zoo, monkeypatch, tmp_path):
    monkeypatch.setenv("DRAFTVERIFY_ZOO", str(tiny_zoo / "zoo"))
    result = CliRunner().invoke(app, ["bench-translate", "--data-dir", str(tiny_zoo / "data"), "--num-prompts", "2",
                                      "-n", "6", "--ks", "2,4", "--betas", "3", "--taus", "1", "--plus-k", "4",
                                      "--gammas", "2", "--bild-fb", "0.5", "--bild-rb", "2", "--threads", "1",
                                      "--out", str(tmp_path), "--name", "t"])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "t.json").read_text())
    names = [r["name"] for r in data["rows"]]
    assert names[:3] == ["hf_greedy", "hf_beam[b=5]", "autoregressive"]
    assert {"specdec[k=2]", "specdec[k=4]", "specdec++[k=4,b=3,t=1]", "hf_assisted[g=2]", "model[g=2]",
            "bild[fb=0.5,rb=2]"} <= set(names)
    for row in data["rows"]:
        if row["lossless"]:
            assert row["same_as_greedy"] == 1.0, row["name"]
    assert (tmp_path / "t.md").read_text().count("`specdec[k=") >= 2
    assert (tmp_path / "t-bild.png").is_file()


def test_bench_translate_bad_input_exits_2(tiny_zoo, monkeypatch, tmp_path):
    monkeypatch.setenv("DRAFTVERIFY_ZOO", str(tiny_zoo / "zoo"))
    result = CliRunner().invoke(app, ["bench-translate", "--data-dir", str(tmp_path), "--out", str(tmp_path)])
    assert result.exit_code == 2 and "--data-dir" in result.output
    result = CliRunner().invoke(app, ["bench-translate", "--data-dir", str(tiny_zoo / "data"), "--ks", "two"])
    assert result.exit_code == 2 and "comma list" in result.output

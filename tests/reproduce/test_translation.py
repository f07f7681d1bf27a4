"""`draftverify reproduce specdec` on a tiny zoo (random Marian target and small model, an untrained NAT drafter):
every row runs, lossless rows equal AT greedy, the tables and the BiLD plot are written, bad input exits 2."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from draftverify.bench.prompts import load_prompts
from draftverify.cli import app
from draftverify.drafters import NatDecoder
from draftverify.reproduce.translation import tokens_per_call_needed
from draftverify.train.seq2seq import make_config
from draftverify.train.translation_data import train_joint_tokenizer
from parallel_corpus import write_parallel_corpus

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


def test_reproduce_specdec_runs_every_row(tiny_zoo, monkeypatch, tmp_path):
    monkeypatch.setenv("DRAFTVERIFY_ZOO", str(tiny_zoo / "zoo"))
    result = CliRunner().invoke(
        app,
        [
            "reproduce",
            "specdec",
            "--data-dir",
            str(tiny_zoo / "data"),
            "--num-prompts",
            "2",
            "-n",
            "6",
            "--ks",
            "2,4",
            "--betas",
            "3",
            "--taus",
            "1",
            "--plus-k",
            "4",
            "--gammas",
            "2",
            "--bild-fb",
            "0.5",
            "--bild-rb",
            "2",
            "--threads",
            "1",
            "--out",
            str(tmp_path),
            "--name",
            "t",
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "t.json").read_text())
    names = [r["name"] for r in data["rows"]]
    assert names[:3] == ["hf_greedy", "hf_beam[b=5]", "autoregressive"]
    assert {
        "specdec[k=2]",
        "specdec[k=4]",
        "specdec++[k=4,b=3,t=1]",
        "hf_assisted[g=2]",
        "model[g=2]",
        "bild[fb=0.5,rb=2]",
    } <= set(names)
    for row in data["rows"]:
        if row["lossless"]:
            assert row["same_as_greedy"] == 1.0, row["name"]
    assert (tmp_path / "t.md").read_text().count("`specdec[k=") >= 2
    assert (tmp_path / "t-bild.png").is_file()
    # a step's cost: the verifier forward and the drafter are parts of it; AR runs 1 token per call, so 2.0x needs 2
    rows = {r["name"]: r for r in data["rows"]}
    spec = rows["specdec[k=4]"]
    assert (
        0 < spec["ms_per_verifier_call"] < spec["ms_per_step"] and 0 < spec["ms_per_drafter_call"] < spec["ms_per_step"]
    )
    assert rows["autoregressive"]["ms_per_drafter_call"] is None
    ar = rows["autoregressive"]["ms_per_step"]
    assert tokens_per_call_needed(rows["autoregressive"], ar) == 2.0
    assert tokens_per_call_needed(spec, ar) == 2.0 * spec["ms_per_step"] / ar
    assert "tokens / call for 2.0x" in (tmp_path / "t.md").read_text()


def test_reproduce_specdec_bad_input_exits_2(tiny_zoo, monkeypatch, tmp_path):
    monkeypatch.setenv("DRAFTVERIFY_ZOO", str(tiny_zoo / "zoo"))
    result = CliRunner().invoke(app, ["reproduce", "specdec", "--data-dir", str(tmp_path), "--out", str(tmp_path)])
    assert result.exit_code == 2 and "--data-dir" in result.output
    result = CliRunner().invoke(app, ["reproduce", "specdec", "--data-dir", str(tiny_zoo / "data"), "--ks", "two"])
    assert result.exit_code == 2 and "comma list" in result.output


def _bench_counts(tiny_zoo, out, *extra):
    return CliRunner().invoke(
        app,
        [
            "reproduce",
            "specdec",
            "--data-dir",
            str(tiny_zoo / "data"),
            "--num-prompts",
            "3",
            "-n",
            "6",
            "--ks",
            "",
            "--betas",
            "",
            "--gammas",
            "2",
            "--bild-fb",
            "0.3,0.9",
            "--bild-rb",
            "2",
            "--threads",
            "1",
            "--counts-only",
            "--out",
            str(out),
            "--name",
            "c",
            *extra,
        ],
    )


def test_counts_only_before_and_after_with_a_perfectly_aligned_small_model(tiny_zoo, monkeypatch, tmp_path):
    """--counts-only records no timing; --aligned-draft adds model_aligned / bild_aligned rows beside the original
    small model's. With the target itself as the "aligned" small model (perfect prediction alignment) every draft is
    accepted: more tokens per target call and fewer large-model calls than the random small model, AT greedy's text."""
    monkeypatch.setenv("DRAFTVERIFY_ZOO", str(tiny_zoo / "zoo"))
    result = _bench_counts(
        tiny_zoo,
        tmp_path,
        "--aligned-draft",
        str(tiny_zoo / "zoo" / "translate" / "target"),
        "--bild-fb",
        "0,0.9",
        "--bild-rb",
        "10",
    )
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "c.json").read_text())
    rows = {r["name"]: r for r in data["rows"]}
    assert {"model[g=2]", "model_aligned[g=2]", "bild[fb=0,rb=10]", "bild_aligned[fb=0.9,rb=10]"} <= set(rows)
    assert not any(n.startswith(("hf_assisted", "specdec")) for n in rows)
    assert data["counts_only"] and not any("seconds_per_sentence" in r or "time_split" in r for r in data["rows"])
    assert rows["autoregressive"]["tokens_per_call"] == 1.0 and rows["autoregressive"]["draft_calls_per_sentence"] == 0
    assert rows["model_aligned[g=2]"]["tokens_per_call"] > 1.5 > rows["model[g=2]"]["tokens_per_call"]
    # fallback 0, lenient rollback: both small models draft up to --bild-gamma tokens and the target keeps them; the
    # random one's text is its own, the aligned one's is AT greedy's, in fewer large-model calls than one per token
    before, after = rows["bild[fb=0,rb=10]"], rows["bild_aligned[fb=0,rb=10]"]
    assert after["same_as_greedy"] == 1.0 > before["same_as_greedy"]
    assert after["target_calls_per_sentence"] < rows["autoregressive"]["target_calls_per_sentence"]
    pairs = data["aligned"]["pairs"]
    assert [p["row"] for p in pairs] == ["model[g=2]", "bild[fb=0,rb=10]", "bild[fb=0.9,rb=10]"]
    assert pairs[1]["target_calls_per_sentence"] == [
        before["target_calls_per_sentence"],
        after["target_calls_per_sentence"],
    ]
    fewest = data["aligned"]["fewest_target_calls"]
    assert fewest["bild_aligned"]["no_loss"] == after["target_calls_per_sentence"]
    md = (tmp_path / "c.md").read_text()
    assert "| s / sentence |" not in md and "speedup" not in md and "Where the time goes" not in md
    assert "## Prediction alignment" in md and "`bild[fb=0.9,rb=10]`" in md
    assert (tmp_path / "c-bild.png").is_file()


def test_reproduce_specdec_bad_small_models_exit_2(tiny_zoo, monkeypatch, tmp_path):
    from transformers import MarianMTModel

    monkeypatch.setenv("DRAFTVERIFY_ZOO", str(tiny_zoo / "zoo"))
    result = _bench_counts(tiny_zoo, tmp_path, "--aligned-draft", str(tmp_path / "missing"))
    assert result.exit_code == 2 and "--aligned-draft" in result.output
    MarianMTModel(make_config("tiny", 77, 0)).save_pretrained(str(tmp_path / "other-vocab"))
    result = _bench_counts(tiny_zoo, tmp_path, "--draft", str(tmp_path / "other-vocab"))
    assert result.exit_code == 2 and "vocab_size" in result.output and "--draft" in result.output

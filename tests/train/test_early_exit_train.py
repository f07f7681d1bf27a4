"""`draftverify train early-exit` on a tiny target: a 3-layer LM trained for a few seconds on the tiny corpus."""

from __future__ import annotations

import json

import pytest
from tiny_corpus import train_tiny_target

torch = pytest.importorskip("torch")

from draftverify.train import early_exit as ee  # noqa: E402


def _quiet(msg):
    pass


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return train_tiny_target(
        tmp_path_factory.mktemp("early_exit"), layers=3, max_positions=128, repeat=4, val_windows=8
    )


def _opts(assets, tmp_path, **kw) -> ee.EarlyExitOptions:
    base = dict(
        target=str(assets / "target"),
        layer=1,
        out_dir=str(tmp_path / "out"),
        work_dir=str(tmp_path / "work"),
        manifest=str(assets / "manifest.json"),
        cache_dir=str(assets / "cache"),
        seq_len=32,
        val_windows=8,
        max_steps=30,
        lr=3e-3,
        warmup_steps=2,
        batch_size=8,
        threads=1,
        bf16=False,
        log_every=1000,
        progress=False,
        command="draftverify train early-exit --test",
    )
    base.update(kw)
    return ee.EarlyExitOptions(**base)


def _held_out(model_dir, assets, layer):
    """Both losses recomputed independently: the exported fp16 model in fp32, the early layer through the
    early_exit drafter's own shallow view."""
    from draftverify.api import load_model
    from draftverify.backends.hf.shallow_view import shallow_view
    from draftverify.train import corpus, tokens
    from draftverify.train.tokenizer import load_tokenizer

    tok = load_tokenizer(assets / "tok")
    data = tokens.load_token_cache(
        corpus.load_manifest(assets / "manifest.json"), str(assets / "tok"), tok, str(assets / "cache"), log=_quiet
    )
    x = tokens.fixed_windows(data["val"], 8, 32)
    model = load_model(model_dir, "float32")
    ce = torch.nn.functional.cross_entropy
    with torch.no_grad():
        full = ce(model(input_ids=x[:, :-1]).logits.reshape(-1, 300), x[:, 1:].reshape(-1))
        early = ce(shallow_view(model, layer)(input_ids=x[:, :-1]).logits.reshape(-1, 300), x[:, 1:].reshape(-1))
    return float(full), float(early)


def test_fine_tune_trains_the_early_layer_keeps_the_full_model_and_exports(assets, tmp_path):
    part = ee.train_early_exit(_opts(assets, tmp_path), log=_quiet, stop_after_steps=10)
    assert part["stopped"] and part["step"] == 10 and not (tmp_path / "out").exists()
    msgs = []
    info = ee.train_early_exit(_opts(assets, tmp_path), log=msgs.append)
    assert any("resumed" in m and "step 10" in m for m in msgs)
    assert info["step"] == 30 and info["resumes"] == 1 and info["exported"]
    before, after = info["before"], info["after"]
    assert before["full"] == pytest.approx(_held_out(assets / "target", assets, 1)[0], abs=2e-3)
    assert after["early"] < before["early"] - 0.3  # the first layer became a usable model
    assert info["degradation"] == pytest.approx(after["full"] - before["full"])
    assert info["degradation"] <= 0.03
    out = tmp_path / "out"
    full, early = _held_out(out, assets, 1)  # the exported weights are the trained ones (fp16 rounding only)
    assert (full, early) == pytest.approx((after["full"], after["early"]), abs=5e-3)
    card = (out / "README.md").read_text()
    assert f"{after['early']:.4f}" in card and f"{before['full']:.4f}" in card
    assert "draftverify train early-exit --test" in card and "--early-exit-layers 1" in card
    assert json.loads((out / "early_exit.json").read_text())["after"] == pytest.approx(after)


def test_a_degraded_full_model_is_not_exported_unless_forced(assets, tmp_path):
    kw = dict(lr=5e-2, max_steps=20)  # far too high a learning rate: the full model gets much worse
    with pytest.raises(ee.DegradedError, match=r"rose by \d+\.\d+ nats .* more than --max-degradation 0.03"):
        ee.train_early_exit(_opts(assets, tmp_path, **kw), log=_quiet)
    assert not (tmp_path / "out").exists()
    report = json.loads((tmp_path / "work" / "early_exit.json").read_text())
    assert report["degradation"] > 0.03 and not report["exported"]
    # the finished run is not retrained: --force exports the same weights
    info = ee.train_early_exit(_opts(assets, tmp_path, force=True, **kw), log=_quiet)
    assert info["exported"] and info["after"] == report["after"] and info["step"] == 20
    assert "exported with --force" in (tmp_path / "out" / "README.md").read_text()


def test_bad_inputs(assets, tmp_path):
    for kw, message in [
        (dict(layer=0), r"--layer must be in \[1, 2\]"),
        (dict(layer=3), r"--layer must be in \[1, 2\]"),
        (dict(target=str(tmp_path / "none")), "no config.json"),
        (dict(max_degradation=-0.1), "--max-degradation must be >= 0"),
        (dict(max_steps=None), "give --max-steps"),
        (dict(manifest=str(tmp_path / "none.json")), "manifest"),
        (dict(seq_len=4096), "max_position_embeddings"),
    ]:
        with pytest.raises(ee.TrainError, match=message):
            ee.train_early_exit(_opts(assets, tmp_path, **kw), log=_quiet)
    assert not (tmp_path / "work").exists()  # nothing was started
    ee.train_early_exit(_opts(assets, tmp_path, max_steps=2), log=_quiet, stop_after_steps=1)
    with pytest.raises(ee.TrainError, match="another target or --layer"):
        ee.train_early_exit(_opts(assets, tmp_path, layer=2, max_steps=2), log=_quiet)


def test_cli_exit_codes(assets, tmp_path):
    from typer.testing import CliRunner

    from draftverify.train.cli import train_app

    common = [
        "early-exit",
        "--target",
        str(assets / "target"),
        "--manifest",
        str(assets / "manifest.json"),
        "--cache-dir",
        str(assets / "cache"),
        "--out",
        str(tmp_path / "out"),
        "--seq-len",
        "32",
        "--val-windows",
        "8",
        "--batch-size",
        "8",
        "--threads",
        "1",
        "--no-bf16",
        "--no-progress",
        "--warmup-steps",
        "2",
    ]
    r = CliRunner().invoke(train_app, common + ["--layer", "5", "--max-steps", "2", "--work-dir", str(tmp_path / "a")])
    assert r.exit_code == 2 and "--layer must be in [1, 2]" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(
        train_app, common + ["--layer", "1", "--max-steps", "20", "--lr", "0.05", "--work-dir", str(tmp_path / "b")]
    )
    assert r.exit_code == 2 and "--max-degradation" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "out").exists()
    r = CliRunner().invoke(train_app, common + ["--layer", "1", "--max-steps", "3", "--work-dir", str(tmp_path / "c")])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output.strip().splitlines()[-1])
    assert summary["layer"] == 1 and summary["steps"] == 3 and summary["early_after"] < summary["early_before"]
    assert (tmp_path / "out" / "config.json").is_file()

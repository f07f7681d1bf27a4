"""`draftverify train nat` on a decoder-only target, end to end on a tiny setup: a tiny LM trained for a few seconds
on the tiny corpus is the frozen target; the NAT drafter learns its greedy continuations from its hidden states,
resumes from its checkpoint, exports with a card, and drives vanilla SpecDec (identical to the target's greedy)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tiny_corpus import train_tiny_target

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

from draftverify.train import nat_lm  # noqa: E402


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return train_tiny_target(tmp_path_factory.mktemp("natlm"))


def _opts(assets, tmp_path, **kw) -> nat_lm.NatLMOptions:
    base = dict(
        target=str(assets / "target"),
        manifest=str(assets / "manifest.json"),
        out_dir=str(tmp_path / "run"),
        export_dir=str(tmp_path / "nat"),
        work_dir=str(tmp_path / "work"),
        num_prompts=16,
        eval_prompts=6,
        min_prompt_tokens=8,
        max_prompt_tokens=16,
        new_tokens=24,
        block_size=4,
        layers=1,
        window=16,
        cuts=6,
        max_steps=60,
        batch_size=8,
        lr=3e-3,
        warmup_steps=5,
        threads=1,
        log_every=1000,
        progress=False,
        eval_minutes=None,
        command="draftverify train nat --test",
    )
    base.update(kw)
    return nat_lm.NatLMOptions(**base)


def test_block_batch_cuts_labels_and_memory_ends():
    states = torch.arange(6 * 2, dtype=torch.float16).reshape(6, 2)
    seq = nat_lm.Sequence([10, 11, 12, 13, 14, 15], first=2, states=states)
    tokens, slots, targets, memory, end = nat_lm.block_batch([seq], 3, [[2, 4]])
    assert tokens[0].tolist() == [12, 0, 0, 14, 0, 0] and slots[0].tolist() == [False, True, True] * 2
    assert targets[0].tolist() == [13, 14, 15, 15, -100, -100]  # past the end: ignored
    assert end.tolist() == [[2, 4]] and torch.equal(memory[0], states.float())
    cuts = nat_lm.draw_cuts([seq], 200, np.random.default_rng(0))[0]
    assert min(cuts) == 2 and max(cuts) == 4  # from the prompt's last token to the one before the last


def test_train_nat_on_a_decoder_only_target_resumes_exports_and_drives_specdec(assets, tmp_path):
    from typer.testing import CliRunner

    from draftverify import SamplingParams, generate
    from draftverify.api import load_model
    from draftverify.drafters import NatDecoder, NatDrafter
    from draftverify.methods import MethodOptions, build_verifier
    from draftverify.train.align import read_generations
    from draftverify.train.cli import train_app

    logs: list[str] = []
    first = nat_lm.train(_opts(assets, tmp_path), log=logs.append, stop_after_steps=20)
    assert first["stopped"] and first["step"] == 20
    # the rest through the command, which sees a decoder-only target and resumes the same run
    r = CliRunner().invoke(
        train_app,
        [
            "nat",
            "--target",
            str(assets / "target"),
            "--manifest",
            str(assets / "manifest.json"),
            "--out",
            str(tmp_path / "run"),
            "--export",
            str(tmp_path / "nat"),
            "--work-dir",
            str(tmp_path / "work"),
            "--num-prompts",
            "16",
            "--eval-prompts",
            "6",
            "--min-prompt-tokens",
            "8",
            "--max-prompt-tokens",
            "16",
            "--new-tokens",
            "24",
            "--block-size",
            "4",
            "--layers",
            "1",
            "--window",
            "16",
            "--cuts",
            "6",
            "--max-steps",
            "60",
            "--batch-size",
            "8",
            "--lr",
            "3e-3",
            "--warmup-steps",
            "5",
            "--threads",
            "1",
            "--no-progress",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "resumed from" in r.output and "step 20" in r.output and "reusing cached hidden states" in r.output
    info = json.loads((tmp_path / "nat" / "nat.json").read_text())["training"]
    assert info["step"] == 60
    assert info["after"]["slot_loss"] < info["before"]["slot_loss"] - 0.5
    assert info["after"]["accepted_per_block"] > info["before"]["accepted_per_block"] + 0.3
    card = (tmp_path / "nat" / "README.md").read_text()
    assert "draftverify train nat --test" in card and f"{info['after']['accepted_per_block']:.3f}" in card
    assert json.loads((tmp_path / "nat" / "nat.json").read_text())["memory_window"] == 16

    target = load_model(assets / "target", "float32")
    nat = NatDecoder.load(tmp_path / "nat")
    greedy = build_verifier("exact", SamplingParams(), MethodOptions())
    _, records, *_ = read_generations(tmp_path / "work" / "generations-val.jsonl")
    for rec in records[:3]:
        prompt = torch.tensor([rec["prompt"]])
        out = generate(target, NatDrafter(nat), greedy, prompt, max_new_tokens=24, gamma=4)
        plain = generate(target, NatDrafter(nat), greedy, prompt, max_new_tokens=24, gamma=1)
        assert out.new_tokens[0].tolist() == plain.new_tokens[0].tolist()
        assert out.stats.accepted_tokens > 0  # the trained drafter's slots are kept


def test_translation_target_still_needs_train_targets(tmp_path):
    from typer.testing import CliRunner

    from draftverify.train.cli import train_app

    (tmp_path / "mt").mkdir()
    (tmp_path / "mt" / "config.json").write_text(json.dumps({"model_type": "marian", "is_encoder_decoder": True}))
    r = CliRunner().invoke(
        train_app, ["nat", "--target", str(tmp_path / "mt"), "--out", str(tmp_path / "run"), "--max-steps", "1"]
    )
    assert r.exit_code != 0 and "--train-targets" in r.output


def test_a_flag_the_targets_kind_does_not_read_is_refused(assets, tmp_path):
    from typer.testing import CliRunner

    from draftverify.train.cli import train_app

    (tmp_path / "mt").mkdir()
    (tmp_path / "mt" / "config.json").write_text(json.dumps({"model_type": "marian", "is_encoder_decoder": True}))
    out = ["--out", str(tmp_path / "run"), "--max-steps", "1"]
    for target, flag, kind in (
        (tmp_path / "mt", ["--data-seed", "3"], "translation model"),
        (assets / "target", ["--max-tokens", "100"], "decoder-only LM"),
        (assets / "target", ["--max-tokens", "2048"], "decoder-only LM"),  # given at its default: still refused
    ):
        r = CliRunner().invoke(train_app, ["nat", "--target", str(target), *flag, *out])
        assert r.exit_code == 2, r.output
        assert kind in r.output and flag[0] in r.output and "Traceback" not in r.output


def test_data_seed_draws_the_prompts_whatever_the_training_seed(assets, tmp_path):
    from draftverify.train import heads
    from draftverify.train.frozen import load_frozen_target
    from draftverify.train.settings import TrainError

    def drawn(name: str, **kw) -> dict:
        opts = _opts(assets, tmp_path / name, work_dir=str(tmp_path / name / "work"), **kw)
        tok, target = load_frozen_target(opts)
        _, splits = heads.greedy_data(opts, tok, target, tmp_path / name / "work", False, lambda line: None)
        return {split: [r["prompt"] for r in records] for split, records in splits.items()}

    shared_a, shared_b = drawn("a", seed=1, data_seed=7), drawn("b", seed=2, data_seed=7)
    assert shared_a == shared_b  # one held-out set (and training set) for runs that differ in --seed only
    assert drawn("c", seed=1) != drawn("d", seed=2)  # without it, --seed draws them
    assert drawn("e", seed=7) == shared_a  # --data-seed N draws what --seed N would
    with pytest.raises(TrainError, match="--data-seed"):
        _opts(assets, tmp_path, data_seed=-1).validate()

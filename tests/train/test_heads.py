"""`draftverify train heads` on a tiny setup: a tiny LM trained for a few seconds on the tiny corpus is the frozen
target; its heads learn its greedy continuations, resume from their checkpoint and plug into bpd."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tiny_corpus import train_tiny_target

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

from draftverify.train import heads as th, lm  # noqa: E402


def _quiet(msg):
    pass


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return train_tiny_target(tmp_path_factory.mktemp("heads"))


def _opts(assets, tmp_path, **kw) -> th.HeadsOptions:
    base = dict(
        target=str(assets / "target"),
        manifest=str(assets / "manifest.json"),
        out_dir=str(tmp_path / "heads"),
        work_dir=str(tmp_path / "work"),
        num_heads=3,
        num_prompts=16,
        eval_prompts=6,
        min_prompt_tokens=8,
        max_prompt_tokens=16,
        new_tokens=24,
        max_steps=80,
        batch_size=64,
        lr=1e-2,
        warmup_steps=5,
        threads=1,
        log_every=1000,
        progress=False,
        command="draftverify train heads --test",
    )
    base.update(kw)
    return th.HeadsOptions(**base)


def test_head_labels_are_the_tokens_i_positions_ahead():
    labels = th.head_labels([10, 11, 12, 13, 14], first=2, num_heads=3)  # positions 2, 3 (4 has no next token)
    assert labels.tolist() == [[14, th.IGNORE], [th.IGNORE, th.IGNORE]]
    assert th.head_labels([1, 2, 3, 4, 5, 6], first=0, num_heads=2)[:, 0].tolist() == [3, 4, 5, 6, th.IGNORE]


def test_batched_continuations_are_the_targets_greedy_text_and_resume(assets, tmp_path):
    from conftest import reference_greedy
    from draftverify.api import load_model

    target = load_model(assets / "target", "float32")
    prompts = [{"source": "x", "prompt": list(range(5, 5 + n))} for n in (6, 9, 6, 7, 9)]  # lengths repeat
    header = {"type": "header", "version": 1, "kind": "test"}
    path = tmp_path / "gen.jsonl"
    logs: list[str] = []
    first = th.batched_continuations(
        path, header, prompts[:3], target, 10, eos_id=1, batch=2, desc="t", progress=False, log=logs.append
    )
    records = th.batched_continuations(
        path, header, prompts, target, 10, eos_id=1, batch=2, desc="t", progress=False, log=logs.append
    )
    assert [r["i"] for r in records] == list(range(5)) and records[:3] == first
    assert any("reusing 3 cached" in m for m in logs)
    for rec in records:
        assert rec["continuation"] == reference_greedy(target, torch.tensor([rec["prompt"]]), 10, eos=1)


def test_train_heads_learns_resumes_and_drives_bpd(assets, tmp_path):
    from draftverify import SamplingParams, generate
    from draftverify.api import load_model
    from draftverify.drafters import BlockwiseDrafter, BlockwiseHeads
    from draftverify.methods import MethodOptions, build_verifier

    logs: list[str] = []
    first = th.train_heads(_opts(assets, tmp_path, max_steps=30), log=logs.append)
    info = th.train_heads(_opts(assets, tmp_path, max_steps=80), log=logs.append)
    assert any("resumed from" in m and "step 30" in m for m in logs)
    assert any("reusing cached features" in m for m in logs)
    assert info["steps"] == 80 and first["steps"] == 30
    before, after = info["heldout_accuracy"]["before"], info["heldout_accuracy"]["after"]
    assert len(after) == 2 and after[0] > before[0] + 0.1  # head 2 learned the target's text two tokens ahead
    card = (tmp_path / "heads" / "README.md").read_text()
    assert "draftverify train heads --test" in card and f"{after[0]:.3f}" in card
    saved = json.loads((tmp_path / "heads" / "heads.json").read_text())
    assert saved["num_heads"] == 3 and saved["training"]["steps"] == 80

    target = load_model(assets / "target", "float32")
    heads = BlockwiseHeads.load(tmp_path / "heads")
    prompt = torch.tensor([[int(t) for t in np.arange(5, 15)]])
    exact = build_verifier("exact", SamplingParams(), MethodOptions())
    out = generate(target, BlockwiseDrafter(heads), exact, prompt, max_new_tokens=30, gamma=4)
    plain = generate(target, BlockwiseDrafter(heads), exact, prompt, max_new_tokens=30, gamma=1)
    assert out.new_tokens.tolist() == plain.new_tokens.tolist()
    assert out.stats.accepted_tokens > 0


def test_bad_options_are_refused(assets, tmp_path):
    with pytest.raises(lm.TrainError, match="2..9"):
        th.train_heads(_opts(assets, tmp_path, num_heads=10), log=_quiet)
    with pytest.raises(lm.TrainError, match="max-steps"):
        th.train_heads(_opts(assets, tmp_path, max_steps=None), log=_quiet)
    with pytest.raises(lm.TrainError, match="config.json"):
        th.train_heads(_opts(assets, tmp_path, target=str(tmp_path)), log=_quiet)
    with pytest.raises(lm.TrainError, match="generate-batch"):
        th.train_heads(_opts(assets, tmp_path, generate_batch=0), log=_quiet)

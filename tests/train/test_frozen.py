"""The frozen-target recipes' shared checks and loading."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from tiny_corpus import train_tiny_target

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

from draftverify.train import frozen  # noqa: E402
from draftverify.train.settings import TrainError  # noqa: E402


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return train_tiny_target(tmp_path_factory.mktemp("frozen"))


def _opts(assets, **kw):
    base = dict(
        target=str(assets / "target"),
        tokenizer_dir=str(assets / "target"),
        manifest=str(assets / "manifest.json"),
        threads=1,
        frozen_dtype=lambda: "float32",
        torch_device=lambda: torch.device("cpu"),
    )
    base.update(kw)
    return SimpleNamespace(**base)


def test_missing_inputs_are_named_with_the_fix(assets, tmp_path):
    frozen.check_inputs(_opts(assets))
    with pytest.raises(TrainError, match="no config.json"):
        frozen.check_inputs(_opts(assets, target=str(tmp_path)))
    with pytest.raises(TrainError, match="no tokenizer.json .* pass --tokenizer DIR"):
        frozen.check_inputs(_opts(assets, tokenizer_dir=str(tmp_path)))
    with pytest.raises(TrainError, match="manifest .* not found .*train corpus"):
        frozen.check_inputs(_opts(assets, manifest=str(tmp_path / "none.json")))


def test_the_target_loads_frozen_in_eval_mode(assets):
    tok, target = frozen.load_frozen_target(_opts(assets))
    assert len(tok) > 0 and not target.training
    assert not any(p.requires_grad for p in target.parameters())


def test_the_target_loads_at_the_runs_dtype(assets):
    _, target = frozen.load_frozen_target(_opts(assets, frozen_dtype=lambda: "bfloat16"))
    assert {p.dtype for p in target.parameters()} == {torch.bfloat16}


def test_a_missing_device_is_a_train_error():
    from draftverify.train.settings import RunOptions

    with pytest.raises(TrainError, match="'cuda:9' is not available here.*available: cpu"):
        RunOptions(max_steps=1, device="cuda:9").validate_run()
    with pytest.raises(TrainError, match="--dtype must be one of"):
        RunOptions(max_steps=1, dtype="half").validate_run()


def test_fit_measured_keeps_the_before_figure_across_a_resume(tmp_path):
    from draftverify.train.runner import Run
    from draftverify.train.settings import RunOptions

    def run(max_steps, figures, logs):
        torch.manual_seed(0)
        model = torch.nn.Linear(2, 1)
        opts = RunOptions(max_steps=max_steps, warmup_steps=0, threads=1, progress=False, command="t")
        trainer = Run(
            model,
            opts,
            tmp_path,
            batches=lambda rng: torch.from_numpy(rng.normal(size=(4, 2))).float(),
            loss=lambda m, x: m(x).pow(2).mean(),
            log=logs.append,
        )
        return frozen.fit_measured(trainer, lambda: next(figures), lambda i: f"part {i}", logs.append)

    logs: list[str] = []
    first = run(2, iter([[0.25], [0.5]]), logs)
    assert first["before"] == [0.25] and first["after"] == [0.5]
    assert "held-out top-1 accuracy before: part 0 0.250" in logs
    assert "held-out top-1 accuracy after: part 0 0.500" in logs
    again = run(3, iter([[0.75]]), logs)  # resumed: "before" is the checkpoint's, one measurement (after) only
    assert again["step"] == 3 and again["before"] == [0.25] and again["after"] == [0.75]

"""The frozen-target recipes' shared checks and loading."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from tiny_corpus import train_tiny_target

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

from draftverify.train import frozen  # noqa: E402
from draftverify.train.trainer import TrainError  # noqa: E402


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return train_tiny_target(tmp_path_factory.mktemp("frozen"))


def _opts(assets, **kw):
    base = dict(target=str(assets / "target"), tokenizer_dir=str(assets / "target"),
                manifest=str(assets / "manifest.json"), threads=1)
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

import pytest

from draftverify.train import presets

pytest.importorskip("torch")


def test_presets_param_counts():
    from transformers import LlamaForCausalLM

    n_target = presets.count_params(LlamaForCausalLM(presets.make_config("target", 8192, 0)))
    n_draft = presets.count_params(LlamaForCausalLM(presets.make_config("draft", 8192, 0)))
    assert 50e6 <= n_target <= 55e6  # the zoo v2 target (zoo/code/target)
    assert 2e6 <= n_draft <= 5e6
    with pytest.raises(presets.TrainError, match="unknown preset"):
        presets.make_config("huge", 8192, 0)

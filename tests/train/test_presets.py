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


def test_train_bench_measures_a_step_of_each_precision():
    """`draftverify train bench`: one timed step in fp32 and in bf16 autocast (it once died on a missing import)."""
    res = presets.bench_step_time("tiny", batch_size=1, seq_len=16, threads=1, steps=1, warmup=0, vocab_size=64)
    assert res["fp32_s_per_step"] > 0 and res["bf16_s_per_step"] > 0 and res["params"] > 0
    assert res["faster"] in ("fp32", "bf16")

"""llama.cpp rows: skipped with a reason when unavailable; when available, greedy tokens equal Hugging Face's."""
from __future__ import annotations


import pytest
import torch
from bench_fixtures import model_dir  # noqa: F401  (fixture)

from draftverify.bench import llamacpp
from draftverify.bench.config import BenchConfig
from draftverify.backends.gguf import converter_available
from draftverify.bench.models import load_models

needs_llama_cpp = pytest.mark.skipif(not (llamacpp.installed() and converter_available()),
                                     reason="llama-cpp-python not installed or no llama.cpp converter "
                                            "(scripts/fetch_llama_cpp_converter.sh)")


def _config(model_dir, **overrides):
    return BenchConfig(**{"target": model_dir / "target", "quick": True, "threads": 1, **overrides}).resolved()


def test_not_installed_is_a_note_with_the_install_command(model_dir, monkeypatch):
    monkeypatch.setattr(llamacpp, "installed", lambda: False)
    config = _config(model_dir)
    runners, notes = llamacpp.llamacpp_runners(config, load_models(config))
    assert runners == [] and notes == [f"llama.cpp rows skipped: llama-cpp-python is not installed "
                                       f"({llamacpp.INSTALL_HINT})"]


def test_no_llama_cpp_rows_unless_wanted(model_dir):
    config = _config(model_dir, runners=("model",))
    assert llamacpp.llamacpp_runners(config, load_models(config)) == ([], [])


@needs_llama_cpp
def test_llama_cpp_greedy_tokens_equal_hf_generate(model_dir):
    config = _config(model_dir, gammas=(3,))
    models = load_models(config)
    runners, notes = llamacpp.llamacpp_runners(config, models)
    assert [r.name for r in runners] == ["llamacpp", "llamacpp_prompt_lookup[g=3]"], notes
    prompt = torch.tensor([[5, 17, 99, 230, 7, 5, 17, 99]])
    expected = models.target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=16,
                                      do_sample=False, eos_token_id=None, pad_token_id=0)[0, 8:].tolist()
    for runner in runners:
        runner.eos_token_id = None  # 16 tokens on every row, EOS or not
        m = runner.run(prompt, 0.0, 0, 16)
        assert m.new_ids == expected, runner.name
        assert m.target_calls >= 1 and m.seconds > 0
    plain = runners[0].run(prompt, 0.0, 0, 16)
    assert plain.target_calls == 16  # one evaluation per token: the prompt's, then one per new token

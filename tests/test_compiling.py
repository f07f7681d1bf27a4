"""compiling.py: which widths --compile compiles for a method, compiling them up front, and the break-even."""
from __future__ import annotations

import pytest
from test_api import PROMPT, model_dirs  # noqa: F401  (shared fixture)

from draftverify.api import load
from draftverify.compiling import Comparison, break_even_tokens, compile_widths


@pytest.mark.parametrize("max_width, fixed, widths", [(5, True, (1, 5)), (1, True, (1,)), (4, True, (1, 4)),
                                                      (17, False, (1, 2, 4, 8, 16, 17)), (33, False, (1, 2, 4, 8, 16, 32, 33))])
def test_compile_widths_are_a_plain_step_and_the_full_width_for_a_fixed_gamma(max_width, fixed, widths):
    assert compile_widths(max_width, fixed) == widths


@pytest.mark.parametrize("method, gamma, widths", [
    ("lookup_model", 4, (1, 5)),  # the draft model too: its catch-ups pad to 5, longer ones run eager
    ("model", 3, (1, 4)),
    ("model", "auto", (1, 2, 4, 8, 16, 17)),
    ("prompt_lookup_tree", 2, (1, 9)),  # 4 matches x 2 tokens + the pending token
])
def test_a_compiled_pipeline_compiles_only_the_widths_its_method_and_gamma_use(model_dirs, method, gamma,  # noqa: F811
                                                                               widths):
    pipe = load(target=model_dirs / "target", draft=model_dirs / "draft", method=method, gamma=gamma, compile=True)
    roles = ["target", "draft"] if method != "prompt_lookup_tree" else ["target"]
    assert [lm.role for lm in pipe.compiled] == roles
    assert all(lm.widths == widths for lm in pipe.compiled)
    assert load(target=model_dirs / "target", method="prompt_lookup").compiled == []


def test_break_even_counts_the_tokens_the_saved_milliseconds_need():
    comparison = Comparison(roles=["target", "draft"], widths=[5, 1], eager_ms=[40.0, 10.0], compiled_ms=[30.0, 8.0])
    assert comparison.saving_ms(3.0) == pytest.approx(16.0)  # 10 ms + 3 draft calls x 2 ms per target call
    assert break_even_tokens(32.0, comparison, tokens_per_call=3.0, draft_calls_per_target_call=3.0) == \
        pytest.approx(32.0 / 0.016 * 3)
    slower = Comparison(roles=["target"], widths=[5], eager_ms=[30.0], compiled_ms=[31.0])
    assert break_even_tokens(32.0, slower, 3.0, 0.0) is None

"""compiling.py: which widths --compile compiles for a method, compiling them up front, and the break-even."""

from __future__ import annotations

import pytest

from draftverify.api import load
from draftverify.compiling import Comparison, break_even_tokens, compile_widths
from test_api import PROMPT, model_dirs  # noqa: F401  (shared fixture)


@pytest.mark.parametrize(
    "max_width, fixed, widths",
    [
        (5, True, (1, 5)),
        (1, True, (1,)),
        (4, True, (1, 4)),
        (17, False, (1, 2, 4, 8, 16, 17)),
        (33, False, (1, 2, 4, 8, 16, 32, 33)),
    ],
)
def test_compile_widths_are_a_plain_step_and_the_full_width_for_a_fixed_gamma(max_width, fixed, widths):
    assert compile_widths(max_width, fixed) == widths


@pytest.mark.parametrize(
    "method, gamma, widths",
    [
        ("lookup_model", 4, (1, 5)),  # the draft model too: its catch-ups pad to 5, longer ones run eager
        ("model", 3, (1, 4)),
        ("model", "auto", (1, 2, 4, 8, 16, 17)),
        ("prompt_lookup_tree", 2, (1, 9)),  # 4 matches x 2 tokens + the pending token
    ],
)
def test_a_compiled_pipeline_compiles_only_the_widths_its_method_and_gamma_use(
    model_dirs,
    method,
    gamma,  # noqa: F811
    widths,
):
    pipe = load(target=model_dirs / "target", draft=model_dirs / "draft", method=method, gamma=gamma, compile=True)
    roles = ["target", "draft"] if method != "prompt_lookup_tree" else ["target"]
    assert [lm.role for lm in pipe.compiled] == roles
    assert all(lm.widths == widths for lm in pipe.compiled)
    assert load(target=model_dirs / "target", method="prompt_lookup").compiled == []


def test_break_even_counts_the_tokens_the_saved_milliseconds_need():
    comparison = Comparison(roles=["target", "draft"], widths=[5, 1], eager_ms=[40.0, 10.0], compiled_ms=[30.0, 8.0])
    assert comparison.saving_ms(3.0) == pytest.approx(16.0)  # 10 ms + 3 draft calls x 2 ms per target call
    assert break_even_tokens(32.0, comparison, tokens_per_call=3.0, draft_calls_per_target_call=3.0) == pytest.approx(
        32.0 / 0.016 * 3
    )
    slower = Comparison(roles=["target"], widths=[5], eager_ms=[30.0], compiled_ms=[31.0])
    assert break_even_tokens(32.0, slower, 3.0, 0.0) is None


def test_drafters_declare_the_models_they_call_and_the_widths_they_verify(models):
    """What compiling reads of a drafter is its declaration (Drafter.models, Drafter.verify_width), never its
    attributes: the draft models it calls (a nested drafter's lagging), and its widest verify at a draft length."""
    from draftverify.compiling import compiled_models, max_verify_width
    from draftverify.drafters import (
        EarlyExitDrafter,
        LookupModelDrafter,
        ModelDrafter,
        ModelTreeDrafter,
        PromptLookupDrafter,
        PromptLookupTreeDrafter,
    )

    model = models("llama", layers=3)
    chain = ModelDrafter(model)
    assert chain.models() == [(chain.lm, False)] and chain.verify_width(4) == 5
    nested = LookupModelDrafter(model)
    assert nested.models() == [(nested.model.lm, True)]  # idle on lookup steps, then it catches up
    assert EarlyExitDrafter(model, 1).models()[0].lm.config.num_hidden_layers == 1
    assert PromptLookupDrafter().models() == [] and PromptLookupDrafter().computes_in_torch is False
    assert PromptLookupTreeDrafter(num_matches=3).verify_width(2) == 7
    tree = ModelTreeDrafter(model, paths=[(0,), (1,), (0, 0)])
    assert tree.verify_width(1) == tree.verify_width(9) == 4 and max_verify_width(tree, 2) == 4
    assert max_verify_width(chain, "auto") == 17
    assert compiled_models(chain.lm, chain) == []  # eager models: nothing to compile

"""The suffix drafter through the loop: the target's own text (greedy, seeded, rows), a second request with the
same prompt drafted from the first one's text, and refusals of bad options."""

from __future__ import annotations

import pytest
import torch

from conftest import ALL_ARCHS, CAUSAL_ARCHS, reference_greedy, varied_model
from draftverify import DraftVerifyError, SamplingParams, generate
from draftverify.draft_length import MAX_GAMMA
from draftverify.drafters import PromptLookupDrafter, SuffixDrafter
from draftverify.methods import MethodOptions, build_drafter, build_verifier
from draftverify.types import DecodingState, RowRequest

torch.set_num_threads(1)

PROMPT = torch.tensor([[5, 17, 33, 8, 41, 5, 17, 60, 5, 17, 33, 9, 5, 17, 60, 2, 5, 17]])
NEW = 32


def exact(params: SamplingParams = SamplingParams()):
    return build_verifier("exact", params, MethodOptions())


@pytest.mark.parametrize("arch", ALL_ARCHS)
def test_greedy_text_is_the_targets_own_twice_over(arch):
    model = varied_model(arch)
    prompt = PROMPT[:, :8] if model.config.is_encoder_decoder else PROMPT
    ref = reference_greedy(model, prompt, NEW)
    drafter = SuffixDrafter()
    for _ in range(2):  # the second generation drafts from the first one's text too
        out = generate(model, drafter, exact(), prompt, max_new_tokens=NEW, gamma=4)
        assert out.new_tokens[0].tolist() == ref


@pytest.mark.parametrize("arch", CAUSAL_ARCHS)
def test_a_repeated_request_is_drafted_from_the_earlier_answer(arch):
    model = varied_model(arch)
    prompt = torch.tensor([[3, 14, 15, 92, 65, 35, 89, 79]])  # no token repeats: prompt lookup starts with nothing
    drafter = SuffixDrafter()
    first = generate(model, drafter, exact(), prompt, max_new_tokens=NEW, gamma=6)
    second = generate(model, drafter, exact(), prompt, max_new_tokens=NEW, gamma=6)
    lookup = generate(model, PromptLookupDrafter(), exact(), prompt, max_new_tokens=NEW, gamma=6)
    assert first.new_tokens.tolist() == second.new_tokens.tolist() == lookup.new_tokens.tolist()
    assert second.stats.tokens_per_call > first.stats.tokens_per_call
    assert second.stats.tokens_per_call > lookup.stats.tokens_per_call
    # the whole answer was seen: every call but the bonus-capped last keeps a full draft of 6
    assert second.stats.target_calls <= -(-NEW // 7) + 1
    drafter.forget()  # the bench's fresh start: back to what this request alone teaches
    again = generate(model, drafter, exact(), prompt, max_new_tokens=NEW, gamma=6)
    assert again.stats.target_calls == first.stats.target_calls


def test_seeded_sampling_gives_the_targets_own_draw():
    model = varied_model("llama")
    params = SamplingParams(temperature=1.0, seed=5)
    plain = generate(
        model, build_drafter("none", model, MethodOptions()), exact(params), PROMPT, params, max_new_tokens=NEW
    )
    drafter = SuffixDrafter()
    for _ in range(2):
        out = generate(model, drafter, exact(params), PROMPT, params, max_new_tokens=NEW, gamma=4)
        assert out.new_tokens.tolist() == plain.new_tokens.tolist()


def test_rows_of_a_batch_read_one_index_and_equal_their_own_text():
    model = varied_model("qwen2")
    prompts = [[3, 14, 15, 92, 65], [7, 7, 21, 3, 14, 15, 92, 65, 35]]
    refs = [reference_greedy(model, torch.tensor([p]), NEW) for p in prompts]
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[False] * (width - len(p)) + [True] * len(p) for p in prompts])
    drafter = SuffixDrafter()
    for _ in range(2):
        out = generate(model, drafter, exact(), ids, max_new_tokens=[NEW, NEW // 2], gamma=4, attention_mask=mask)
        assert out.rows == [refs[0], refs[1][: NEW // 2]]
    # both rows' texts (prompt + answer, twice each) stayed in the index; the first generation's are finished
    # history (the last row to leave stays live until the next generation starts: the loop ends without a drop)
    assert len(drafter.index.live) == 1 and min(drafter.index.live) >= 2
    assert sorted(len(s) for s in drafter.index.sequences.values()) == sorted(
        [len(prompts[0]) + NEW] * 2 + [len(prompts[1]) + NEW // 2] * 2
    )


def test_a_row_that_joins_mid_generation_reads_and_feeds_the_index():
    model = varied_model("llama")
    prompts = [[3, 14, 15, 92, 65], [9, 26, 53, 58]]
    refs = [reference_greedy(model, torch.tensor([p]), NEW) for p in prompts]
    drafter = SuffixDrafter()
    drafter.index.finish(drafter.index.add(prompts[1] + refs[1]))  # the joining request was answered before
    pending = [[RowRequest(prompts[1], NEW)]]
    out = generate(
        model,
        drafter,
        exact(),
        torch.tensor([prompts[0]]),
        max_new_tokens=NEW,
        gamma=6,
        admit=lambda: pending.pop(0) if pending else [],
    )
    assert out.rows == refs
    joined = max(drafter.index.sequences)
    assert drafter.index.sequences[joined] == prompts[1] + refs[1]
    # drafted from the earlier answer: most of its tokens came as accepted drafts
    assert out.stats.accepted_tokens >= NEW // 2


def test_from_options_reads_the_declared_options():
    drafter = build_drafter(
        "suffix",
        varied_model("llama"),
        MethodOptions(suffix_max_match=5, suffix_min_match=2, suffix_cache_tokens=100, suffix_min_prob=0.3),
    )
    assert (drafter.max_match, drafter.min_match, drafter.cache_tokens, drafter.min_prob) == (5, 2, 100, 0.3)
    assert drafter.index.max_tokens == 100


class _DearWidth:
    """A target whose forward grows dear with its width (llama.cpp's flag), for the defaults it sets."""

    dear_width = True


@pytest.mark.parametrize(
    "target, given, expected",
    [
        (None, (None, None), (1, 8)),  # hf: draft after short matches
        (_DearWidth(), (None, None), (24, 24)),  # llama.cpp: only after long ones, as its ngram-mod
        (_DearWidth(), (None, 12), (12, 12)),  # a given longest match caps the default shortest
        (None, (12, None), (12, 12)),  # a given shortest match raises the default longest
        (_DearWidth(), (2, 5), (2, 5)),  # given ones stand
    ],
)
def test_match_lengths_default_by_how_dear_the_targets_width_is(target, given, expected):
    model = varied_model("llama") if target is None else target
    min_match, max_match = given
    drafter = build_drafter("suffix", model, MethodOptions(suffix_min_match=min_match, suffix_max_match=max_match))
    assert (drafter.min_match, drafter.max_match) == expected


@pytest.mark.parametrize("target, longest", [(None, None), (_DearWidth(), MAX_GAMMA)])
def test_on_a_dear_width_target_the_cost_model_may_run_sure_copies_to_the_widest_draft(target, longest):
    model = varied_model("llama") if target is None else target
    assert build_drafter("suffix", model, MethodOptions()).longest_draft == longest


@pytest.mark.parametrize("longest, reach", [(None, 32), (MAX_GAMMA, MAX_GAMMA)])
def test_conf_drafts_a_sure_copy_as_far_as_the_drafters_longest_draft(longest, reach):
    """A text seen before is copied whole: conf's first step (no timings yet) drafts to its bound, which is the
    drafter's longest draft where it declares one, and the text stays the target's own."""
    model = varied_model("llama")
    prompt = torch.tensor([[3, 14, 15, 92, 65, 35, 89, 79]])
    ref = reference_greedy(model, prompt, 80)
    drafter = SuffixDrafter(longest_draft=longest)
    drafter.index.finish(drafter.index.add(prompt[0].tolist() + ref))
    lengths = []
    out = generate(
        model,
        drafter,
        exact(),
        prompt,
        max_new_tokens=80,
        gamma="conf",
        on_step=lambda r, rows: lengths.append(r.length),
    )
    assert out.new_tokens[0].tolist() == ref
    assert lengths[0] == reach


def test_proposal_is_deterministic_and_one_hot():
    drafter = SuffixDrafter()
    drafter.index.finish(drafter.index.add([1, 2, 3, 4, 5, 6]))
    state = DecodingState(torch.tensor([[9, 1, 2]]), None, 3, SamplingParams(), None)
    draft = drafter.propose(state, 3)
    assert draft.tokens.tolist() == [[3, 4, 5]] and draft.q_probs is None


@pytest.mark.parametrize(
    "options, flag",
    [
        (dict(max_match=2, min_match=3), "--suffix-min-match"),
        (dict(min_match=0), "--suffix-min-match"),
        (dict(cache_tokens=0), "--suffix-cache-tokens"),
        (dict(min_prob=1.5), "--suffix-min-prob"),
        (dict(min_prob=-0.1), "--suffix-min-prob"),
    ],
)
def test_bad_options_are_refused_naming_the_flag(options, flag):
    with pytest.raises(DraftVerifyError, match=flag):
        SuffixDrafter(**options)

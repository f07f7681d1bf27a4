"""Bench pieces without models: option parsing and errors, HF step accounting, summary and the loud warning."""

from __future__ import annotations

import pytest
import torch
from rich.console import Console
from torch import nn
from typer.testing import CliRunner

from draftverify import DraftVerifyError
from draftverify.bench.cli import summary_table
from draftverify.bench.config import BenchConfig, parse_floats, parse_gammas
from draftverify.bench.counting import ForwardCounter, step_accounting
from draftverify.bench.ours import default_early_exit_layers
from draftverify.bench.prompts import Prompt
from draftverify.bench.report import overshoot_text, render_markdown
from draftverify.bench.runners import HFRunner, Hooks, OursRunner
from draftverify.bench.summary import equality_failures, summarize
from draftverify.cli import app


def test_gamma_lists_parse_integers_auto_and_heuristic():
    assert parse_gammas("2,3, 8,auto,heuristic") == (2, 3, 8, "auto", "heuristic")
    assert parse_floats("--temperature", "greedy,1.0") == (0.0, 1.0)
    for bad in ("0", "2,,3", "fast", "-1"):
        with pytest.raises(DraftVerifyError, match="--gamma"):
            parse_gammas(bad)


def test_gamma_lists_parse_conf_with_and_without_a_threshold():
    assert parse_gammas("auto,conf,conf=0.3") == ("auto", "conf", "conf=0.3")
    assert BenchConfig(target="t", gammas=("conf", "conf=0.25", 4)).resolved().gammas == ("conf", "conf=0.25", 4)
    for bad in ("conf=2", "conf=x", "confidence"):
        with pytest.raises(DraftVerifyError, match="--gamma"):
            parse_gammas(bad)
    with pytest.raises(DraftVerifyError, match="--gamma"):
        BenchConfig(target="t", gammas=("conf=1.5",)).resolved()


def test_quick_and_full_defaults():
    quick = BenchConfig(target="t", quick=True).resolved()
    assert (quick.num_prompts, quick.max_new_tokens, quick.gammas) == (2, 8, (3, "auto"))
    # a smoke test: greedy only, no warm-up, BiTA with one mask token (each still overridable)
    assert (quick.temperatures, quick.warmup_tokens, quick.options["bita_masks"]) == ((0.0,), 0, 1)
    overridden = BenchConfig(
        target="t", quick=True, temperatures=(0.0, 1.0), warmup_tokens=4, options={"bita_masks": 2}
    ).resolved()
    assert overridden.temperatures == (0.0, 1.0) and overridden.options["bita_masks"] == 2
    assert quick.name == "bench-humaneval-quick"
    full = BenchConfig(zoo="code", prompts="spec_bench:qa").resolved()
    assert (full.num_prompts, full.max_new_tokens, full.temperatures) == (20, 128, (0.0, 1.0))
    assert (full.warmup_tokens, full.options.get("bita_masks")) == (16, None)
    assert full.gammas == (2, 3, 4, 5, 6, 8, "auto") and full.name == "bench-spec_bench-qa"
    assert full.bild_fb == (0.2, 0.4, 0.6, 0.8) and full.bild_rb == (1.0, 2.0, 3.0, 5.0)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(num_prompts=0), "--num-prompts"),
        (dict(max_new_tokens=-3), "--max-new-tokens"),
        (dict(temperatures=(-1.0,)), "--temperature"),
        (dict(runners=("model", "medusa")), "unknown runner family medusa"),
        (dict(bild_fb=(1.5,)), "--bild-fb"),
        (dict(threads=0), "--threads"),
    ],
)
def test_bad_options_name_the_option(overrides, message):
    with pytest.raises(DraftVerifyError, match=message):
        BenchConfig(**{"target": "t", **overrides}).resolved()


def test_cli_bad_options_exit_2_with_a_message(tmp_path):
    runner = CliRunner()
    cases = [
        (["--target", "t", "--gamma", "2,zero"], "--gamma"),
        (["--target", "t", "--temperature", "hot"], "--temperature"),
        (["--target", "t", "--data-dir", str(tmp_path)], "--data-dir"),  # no HumanEval file there
        (["--zoo", "nonesuch"], "no zoo entry 'nonesuch'"),
    ]
    for extra, message in cases:
        result = runner.invoke(app, ["bench", "speed", "--out", str(tmp_path / "out"), *extra])
        assert result.exit_code == 2, (extra, result.output)
        assert message in result.output, (extra, result.output)
        assert "Traceback" not in result.output


def test_no_models_means_the_code_zoo_and_explicit_ones_win():
    assert BenchConfig(quick=True).resolved().zoo == "code"
    explicit = BenchConfig(target="t").resolved()
    assert (explicit.zoo, explicit.target) == (None, "t")
    assert BenchConfig(zoo="other").resolved().zoo == "other"


def test_early_exit_default_layers_are_proper_prefixes():
    assert default_early_exit_layers(8) == (2, 4)
    assert default_early_exit_layers(3) == (1, 2)
    assert default_early_exit_layers(1) == ()


def test_step_accounting_reconstructs_hf_assisted_steps():
    # prompt 5; step 1 feeds prompt + 3 drafts, keeps 1 draft (+1 own) -> 7 committed, cache 6;
    # step 2 feeds 1 pending + 3 drafts, keeps all 3 (+1) -> 11 committed; step 3 feeds 1 + 2 drafts, ends at 13
    calls = [(8, 0), (4, 6), (3, 10)]
    counts = step_accounting(calls, prompt_length=5, new_tokens=8)
    assert (counts.target_calls, counts.drafted, counts.accepted, counts.rejections) == (3, 8, 5, 2)
    plain = step_accounting([(5, 0)] + [(1, 4 + i) for i in range(7)], prompt_length=5, new_tokens=8)
    assert (plain.target_calls, plain.drafted, plain.accepted, plain.rejections) == (8, 0, 0, 0)


def _record(runner, prompt, ids, seconds=1.0, temperature=0.0, overshoot=0):
    return {
        "runner": runner,
        "temperature": temperature,
        "prompt_index": prompt,
        "new_ids": ids,
        "new_tokens": len(ids),
        "seconds": seconds,
        "target_calls": len(ids),
        "draft_calls": 0,
        "drafted": 0,
        "accepted": 0,
        "rejections": 0,
        "stats": None,
        "text": " ".join(map(str, ids)),
        "overshoot": overshoot,
    }


def test_a_lossless_runner_that_differs_from_the_baseline_raises_a_loud_warning():
    runners = [OursRunner("hf_generate", "hf_generate"), OursRunner("model[g=2]", "model", gamma=2)]
    prompts = [Prompt("a", "x", reference="1 2"), Prompt("b", "y")]
    records = [
        _record("hf_generate", 0, [1, 2]),
        _record("hf_generate", 1, [3, 4], seconds=3.0),
        _record("model[g=2]", 0, [1, 2], seconds=0.5),
        _record("model[g=2]", 1, [3, 5], seconds=1.5),
    ]
    rows = summarize(runners, (0.0,), prompts, records)
    by_name = {r["runner"]: r for r in rows}
    assert by_name["hf_generate"]["equal_to_baseline"] == 1.0
    assert by_name["model[g=2]"]["equal_to_baseline"] == 0.5
    assert by_name["model[g=2]"]["speedup"] == pytest.approx((4 / 2.0) / (4 / 4.0))
    assert [r["runner"] for r in equality_failures(rows)] == ["model[g=2]"]
    assert by_name["hf_generate"]["chrf_reference"] == pytest.approx(100.0)  # "1 2" against reference "1 2"
    assert by_name["model[g=2]"]["chrf_target_greedy"] < 100.0


def _result(**overrides) -> dict:
    """A bench result with no runner, as render_markdown reads it."""
    result = {
        "config": {"prompts": "humaneval", "quick": False, "temperatures": [0.0], "max_new_tokens": 4},
        "machine": {"cpu_model": "cpu", "cores": 2},
        "date": "today",
        "prompts": [],
        "versions": {"torch_threads": 1, "python": "3", "torch": "t", "transformers": "x", "draftverify": "0"},
        "runners": [],
        "files": {"json": "x.json"},
        "notes": [],
        "command": "cmd",
        "reproduce": "draftverify bench speed",
        "warnings": [],
    }
    return {**result, **overrides}


def test_markdown_shows_warnings_first():
    result = _result(
        notes=["a note"], command="cmd --a", reproduce="draftverify bench speed --a", warnings=["model differs"]
    )
    result["versions"].update(git_commit="abc", git_dirty=False)
    markdown = render_markdown(result)
    assert "> **WARNING**: model differs" in markdown
    assert markdown.index("WARNING") < markdown.index("How to read")
    assert "draftverify bench speed --a" in markdown and "cmd --a" in markdown and "- a note" in markdown


def test_markdown_names_the_llama_cpp_library_and_what_its_kernels_mean_for_exactness():
    result = _result()
    assert "llama.cpp library" not in render_markdown(result)  # no llama.cpp row ran
    result["versions"]["llama_cpp_library"] = {"path": None, "llamafile": True}
    assert "llama.cpp library: llama-cpp-python's own build; llamafile's matrix kernels in, flash attention on" in (
        render_markdown(result)
    )
    result["versions"]["llama_cpp_library"] = {"path": "/x/bin", "llamafile": False}
    result["config"]["flash_attn"] = False
    assert "`LLAMA_CPP_LIB_PATH=/x/bin`; llamafile's matrix kernels left out, flash attention off: a chain's" in (
        render_markdown(result)
    )


def test_the_reproduce_line_carries_the_llama_cpp_library_it_ran_on(monkeypatch, tmp_path):
    from draftverify.bench.environment import REPO, reproduce_command

    monkeypatch.delenv("LLAMA_CPP_LIB_PATH", raising=False)
    assert reproduce_command("/venv/bin/draftverify bench speed --zoo code") == "draftverify bench speed --zoo code"
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(REPO / ".cache" / "lib"))
    assert reproduce_command("draftverify bench speed") == "LLAMA_CPP_LIB_PATH=.cache/lib draftverify bench speed"
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(tmp_path))
    assert reproduce_command("draftverify bench speed") == f"LLAMA_CPP_LIB_PATH={tmp_path} draftverify bench speed"


class _Overshooting(nn.Module):
    """Stands in for a model whose generate() returns `extra` tokens past max_new_tokens (HF prompt lookup)."""

    def __init__(self, extra: int):
        super().__init__()
        self.extra = extra

    def generate(self, input_ids, max_new_tokens=None, generation_config=None, **kwargs):
        wanted = generation_config.max_new_tokens + self.extra
        self(input_ids)  # one forward, seen by the counting hook
        return torch.cat([input_ids, torch.arange(wanted)[None] + 10], dim=1)

    def forward(self, input_ids):
        return input_ids


def test_hf_runner_cuts_the_overshoot_and_reports_it():
    model = _Overshooting(extra=3)
    runner = HFRunner(
        "hf_prompt_lookup[g=4]",
        "hf_prompt_lookup",
        gamma=4,
        model=model,
        hooks=Hooks(target=ForwardCounter(model)),
        prompt_lookup=4,
        max_matching_ngram_size=3,
    )
    m = runner.run(torch.tensor([[1, 2, 3]]), temperature=0.0, seed=0, max_new_tokens=5)
    assert m.new_ids == [10, 11, 12, 13, 14] and m.new_tokens == 5
    assert m.overshoot == 3
    assert (
        HFRunner(
            "hf_generate", "hf_generate", model=_Overshooting(0), hooks=Hooks(target=ForwardCounter(nn.Linear(1, 1)))
        )
        .run(torch.tensor([[1]]), 0.0, 0, 4)
        .overshoot
        == 0
    )


def test_overshoot_is_not_an_inequality_and_is_its_own_column():
    runners = [
        OursRunner("hf_generate", "hf_generate"),
        OursRunner("hf_prompt_lookup[g=4]", "hf_prompt_lookup", gamma=4),
    ]
    prompts = [Prompt("a", "x"), Prompt("b", "y")]
    records = [
        _record("hf_generate", 0, [1, 2]),
        _record("hf_generate", 1, [3, 4]),
        _record("hf_prompt_lookup[g=4]", 0, [1, 2], overshoot=3),
        _record("hf_prompt_lookup[g=4]", 1, [3, 4]),
    ]
    rows = {r["runner"]: r for r in summarize(runners, (0.0,), prompts, records)}
    lookup = rows["hf_prompt_lookup[g=4]"]
    assert lookup["equal_to_baseline"] == 1.0 and equality_failures(list(rows.values())) == []
    assert (lookup["overshoot_tokens"], lookup["overshoot_prompts"]) == (3, 1)
    assert lookup["tokens_per_second"] == pytest.approx(2.0)  # 4 kept tokens in 2 s: the 3 extra are not counted
    assert overshoot_text(lookup) == "3 (1/2)" and overshoot_text(rows["hf_generate"]) == "-"


def test_terminal_summary_keeps_the_bracketed_labels():
    names = ["hf_assisted[g=2]", "hf_assisted[g=3]", "hf_assisted[heuristic]", "model[L=1,g=3]"]
    rows = [
        {
            "runner": n,
            "temperature": 0.0,
            "tokens_per_second": 1.0,
            "speedup": 1.0,
            "tokens_per_call": 1.0,
            "alpha": None,
            "equal_to_baseline": 1.0,
            "lossless": True,
            "overshoot_tokens": 0,
            "overshoot_prompts": 0,
            "prompts": 1,
        }
        for n in names
    ]
    console = Console(record=True, width=200)
    console.print(summary_table(rows))
    text = console.export_text()
    for name in names:
        assert name in text, text


class CountingDrafter:
    """A drafter stand-in that counts forget() calls."""

    needs_target_hidden = False
    longest_draft = None  # as Drafter: the length policy keeps its own bound

    def __init__(self):
        self.forgets = 0

    def forget(self):
        self.forgets += 1


def test_our_rows_forget_per_prompt_unless_asked_to_keep_a_round(monkeypatch):
    from types import SimpleNamespace

    import draftverify.bench.runners as runners_module

    stats = SimpleNamespace(target_calls=1, draft_calls=0, drafted_tokens=0, accepted_tokens=0, rejections=0)
    stats.as_dict = dict
    monkeypatch.setattr(
        runners_module, "generate", lambda *a, **k: SimpleNamespace(new_tokens=torch.tensor([[5]]), stats=stats)
    )
    hooks = Hooks(target=ForwardCounter(nn.Identity()))
    for keep, forgets_after_two in ((False, 2), (True, 0)):
        drafter = CountingDrafter()
        row = OursRunner("x", "x", drafter=drafter, hooks=hooks, forget_each_prompt=not keep)
        row.run(torch.tensor([[1, 2]]), 0.0, 0, 1)
        row.run(torch.tensor([[1, 2]]), 0.0, 0, 1)
        assert drafter.forgets == forgets_after_two
        row.new_round()  # a new round starts empty either way
        assert drafter.forgets == forgets_after_two + 1

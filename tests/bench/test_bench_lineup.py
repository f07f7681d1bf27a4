"""Our rows come from the method registry: today's methods, a newly registered one, skips with reasons."""

from __future__ import annotations

from dataclasses import replace

import pytest
from bench_fixtures import ROOT, model_dir  # noqa: F401  (fixture)
from typer.testing import CliRunner

from draftverify import DraftVerifyError
from draftverify.backends.hf.cached_lm import CachedLM
from draftverify.bench import families
from draftverify.bench.config import BenchConfig
from draftverify.bench.lineup import build_runners
from draftverify.bench.models import load_models
from draftverify.bench.ours import plan_rows
from draftverify.bench.runners import Hooks, install_hooks
from draftverify.cli import app
from draftverify.errors import OptionValueError
from draftverify.methods import METHODS, Method


def _config(model_dir, **overrides) -> BenchConfig:
    paths = dict(
        target=model_dir / "target",
        draft=model_dir / "draft",
        aligned_draft=model_dir / "aligned",
        options={"ngram_path": model_dir / "ngram.safetensors"},
    )
    return BenchConfig(**{**paths, "quick": True, **overrides}).resolved()


@pytest.fixture(scope="module")
def models(model_dir):
    return load_models(_config(model_dir))


def _plan(config, models):
    return plan_rows(config, models, CachedLM(models.target, role="target"))


def test_todays_methods_give_the_rows_the_bench_always_had(model_dir, models):
    rows, notes = _plan(_config(model_dir), models)
    by_name = {r.name: r for r in rows}
    assert set(by_name) == {
        "model[g=3]",
        "model[auto]",
        "model_aligned[g=3]",
        "prompt_lookup[g=3]",
        "ngram[g=3]",
        "early_exit[L=1,g=3]",
        "bild[fb=0.4,rb=2]",
        "bild_early_exit[L=1,fb=0.4,rb=2]",
        "specdec++[fb=0.4]",
        "lookup_model[g=3]",
        "lookup_model_aligned[g=3]",
        "model_tree[g=3]",
        "model_tree_aligned[g=3]",
        "prompt_lookup_tree[g=3]",
        "suffix[g=3]",
        "earn[g=3]",
        "earn_aligned[g=3]",
        "cross_tokenizer[g=3]",
        "cross_tokenizer_aligned[g=3]",
    }
    # the tiny target has no trained blockwise heads, BiTA adapter, NAT drafter nor EAGLE-3 head: those methods are
    # skipped, saying why
    assert sorted(n.split()[0] for n in notes) == [
        "bita",
        "bita_chain",
        "bita_tree",
        "bpd",
        "bpd_neural",
        "bpd_ngram",
        "bpd_pbest",
        "eagle3",
        "eagle3_tree",
        "specdec",
        "specdec++_nat",
    ]
    assert all("needs trained heads" in n for n in notes if n.startswith("bpd"))
    assert all("needs a trained adapter" in n for n in notes if n.startswith("bita"))
    assert all("NAT drafter needs trained weights" in n for n in notes if n.startswith("specdec"))
    assert all(r.lossless for r in rows if r.family in ("model", "model_aligned", "prompt_lookup", "early_exit"))
    bild = by_name["bild[fb=0.4,rb=2]"]
    assert not bild.lossless and bild.gamma == 4 and bild.options.alpha_fb == 0.4 and bild.options.alpha_rb == 2.0
    assert by_name["model_aligned[g=3]"].options.draft_model.model is models.aligned_draft
    assert by_name["model[g=3]"].options.draft_model.model is models.draft
    # earn runs a draft model where given, beside its lookups: it has an aligned twin too
    assert by_name["earn_aligned[g=3]"].options.draft_model.model is models.aligned_draft
    assert by_name["early_exit[L=1,g=3]"].settings == {"layers": 1}


def test_an_aligned_twin_asked_of_a_method_without_a_draft_model_is_skipped_saying_why(model_dir, models):
    config = _config(model_dir, runners=("earn_aligned", "suffix_aligned"))
    rows, notes = _plan(config, models)
    assert {r.family for r in rows} == {"earn_aligned"}
    assert notes == ["suffix_aligned skipped: suffix runs no draft model"]


def test_an_aligned_twin_in_a_bench_without_a_draft_model_is_skipped_naming_the_missing_draft(model_dir, models):
    config = _config(model_dir, runners=("earn_aligned",))
    rows, notes = _plan(config, replace(models, draft=None, aligned_draft=None))
    assert rows == []
    assert notes == ["earn_aligned skipped: this bench has no draft model"]


def test_conf_gammas_give_method_conf_rows(model_dir, models):
    config = _config(model_dir, quick=False, gammas=("auto", "conf", "conf=0.3"), runners=("model", "lookup_model"))
    names = {r.name: r for r in _plan(config, models)[0]}
    assert {"model[auto]", "model[conf]", "model[conf=0.3]", "lookup_model[conf]"} <= set(names)
    assert names["model[conf]"].gamma == "conf" and names["model[conf]"].lossless


def test_full_mode_sweeps_gammas_layers_and_the_lossy_grid(model_dir, models):
    config = _config(
        model_dir, quick=False, gammas=(2, 4), bild_fb=(0.2, 0.6), bild_rb=(1.0, 3.0), early_exit_layers=(1, 2)
    )
    names = {r.name for r in _plan(config, models)[0]}
    assert {
        "early_exit[L=1,g=2]",
        "early_exit[L=2,g=4]",
        "bild[fb=0.6,rb=1]",
        "bild[fb=0.2,rb=3]",
        "bild_early_exit[L=2,fb=0.6,rb=3]",
        "ngram[g=4]",
    } <= names
    assert sum(n.startswith("bild[") for n in names) == 4 and sum(n.startswith("early_exit[") for n in names) == 4


def test_a_newly_registered_method_appears_without_editing_the_bench(model_dir, models, monkeypatch):
    monkeypatch.setitem(METHODS, "lookup_new", Method("prompt_lookup", "exact", "a new lossless method"))
    monkeypatch.setitem(METHODS, "model_new", Method("model", "exact", "a new method with a draft model"))
    monkeypatch.setitem(METHODS, "lookup_lossy", Method("prompt_lookup", "bild", "a new lossy method"))
    assert {"lookup_new", "model_new_aligned", "lookup_lossy"} <= set(families())
    config = _config(model_dir, runners=("lookup_new", "model_new", "model_new_aligned", "lookup_lossy"))
    runners, notes = build_runners(config, models, Hooks(target=None))
    rows = {r.name: r for r in runners}
    assert {
        "lookup_new[g=3]",
        "lookup_new[auto]",
        "model_new[g=3]",
        "model_new_aligned[g=3]",
        "lookup_lossy[rb=2]",
    } <= set(rows)
    assert not any(name.startswith("lookup_new_aligned") for name in rows)  # no draft model, no aligned twin
    assert rows["lookup_new[g=3]"].lossless and not rows["lookup_new[g=3]"].greedy_only
    assert not rows["lookup_lossy[rb=2]"].lossless and rows["lookup_lossy[rb=2]"].greedy_only
    assert rows["lookup_lossy[rb=2]"].verifier == "bild" and rows["lookup_lossy[rb=2]"].options.alpha_rb == 2.0
    assert type(rows["model_new[g=3]"].drafter).name == "model"
    assert notes == []


def test_a_method_without_its_resources_is_skipped_with_the_reason(model_dir):
    config = BenchConfig(target=model_dir / "target", quick=True).resolved()  # no draft, no n-gram table
    rows, notes = _plan(config, load_models(config))
    families_run = {r.family for r in rows}
    # earn drafts from the suffix cache and prompt lookup when no draft model is given
    assert families_run == {"prompt_lookup", "prompt_lookup_tree", "suffix", "earn", "early_exit", "bild_early_exit"}
    assert any(n.startswith("model skipped") and "needs a draft model" in n for n in notes), notes
    assert any(n.startswith("ngram skipped") and "needs a table" in n for n in notes), notes


@pytest.mark.parametrize(
    "options, runners, message",
    [
        ({"suffix_min_match": 0}, ("suffix",), "--suffix-min-match"),
        ({"suffix_min_match": 30, "suffix_max_match": 24}, ("suffix",), "got 30 and 24"),
        ({"prompt_lookup_max_ngram": 0}, ("prompt_lookup",), "min_ngram <= max_ngram"),
        ({"prompt_lookup_matches": 0}, ("prompt_lookup_tree",), "num_matches >= 1"),
    ],
)
def test_a_wrong_option_value_stops_the_bench_instead_of_skipping_the_method(model_dir, options, runners, message):
    """A method that cannot run here is left out with a note; a value the user gave wrong is theirs to fix."""
    config = BenchConfig(target=model_dir / "target", quick=True, runners=runners, options=options).resolved()
    with pytest.raises(OptionValueError, match=message):
        _plan(config, load_models(config))


def test_a_wrong_option_value_is_a_usage_error_on_the_command_line(model_dir, tmp_path):
    out = tmp_path / "out"
    args = ["bench", "speed", "--quick", "--target", str(model_dir / "target"), "--runners", "suffix"]
    args += ["--suffix-min-match", "0", "--out", str(out), "--threads", "1", "--no-progress", "--no-plots"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "--suffix-min-match" in result.output and "skipped" not in result.output
    assert not out.exists() or not any(out.iterdir())  # no report of a run that did not happen


def test_backend_llamacpp_without_its_extra_is_a_usage_error_naming_the_install(model_dir, tmp_path, monkeypatch):
    """--backend llamacpp is asked for by name: without llama-cpp-python the bench stops before loading a model
    (an exit 0 with every llama.cpp row skipped would read as a run of that backend)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    with pytest.raises(DraftVerifyError, match=r"pip install -e \"\.\[llamacpp\]\""):
        BenchConfig(target=model_dir / "target", quick=True, backends=("hf", "llamacpp")).resolved()
    out = tmp_path / "out"
    args = [
        "bench",
        "speed",
        "--quick",
        "--target",
        str(model_dir / "target"),
        "--backend",
        "llamacpp",
        "--out",
        str(out),
    ]
    result = CliRunner().invoke(app, [*args, "--threads", "1", "--no-progress", "--no-plots"])
    assert result.exit_code == 2, result.output
    assert "llama-cpp-python" in result.output and "skipped" not in result.output
    assert not out.exists() or not any(out.iterdir())


def test_peers_built_before_a_failing_row_are_closed(model_dir, models, monkeypatch):
    """A bad option met after the peers' rows are built (llamacpp_native starts its servers then) closes them."""
    from draftverify.bench import lineup

    closed = []

    class Peer:
        name = "peer"

        def close(self):
            closed.append(self.name)

    def failing(*args, **kwargs):
        raise OptionValueError("--suffix-min-match must be at least 1, got 0")

    monkeypatch.setattr(lineup, "peer_runners", lambda config, models, hooks: ([Peer()], []))
    monkeypatch.setattr(lineup, "our_runners", failing)
    with pytest.raises(OptionValueError):
        build_runners(_config(model_dir, runners=("suffix",)), models, Hooks(target=None))
    assert closed == ["peer"]


def test_unknown_runner_family_lists_the_registered_ones(model_dir):
    with pytest.raises(DraftVerifyError, match="unknown runner family medusa.*specdec\\+\\+"):
        _config(model_dir, runners=("model", "medusa"))


OTHERTOK = ROOT / "zoo" / "code" / "draft-othertok"


def test_a_draft_with_another_tokenizer_gives_cross_tokenizer_rows_and_universal_assisted_generation(model_dir):
    """--draft with its own tokenizer: our `model` rows re-tokenize its text, hf_assisted passes both tokenizers
    (Hugging Face's universal assisted generation, offline), the methods that read its logits are skipped saying
    why; every greedy row gives the target's own tokens."""
    config = BenchConfig(
        target=model_dir / "target",
        draft=OTHERTOK,
        quick=True,
        gammas=(3,),
        runners=("model", "lookup_model", "hf_assisted"),
    ).resolved()
    models = load_models(config)
    assert models.draft_tokenizer is not None and len(models.draft_tokenizer) != len(models.tokenizer)
    assert models.describe()["draft"]["tokenizer"] == f"its own (vocabulary {len(models.draft_tokenizer)})"
    hooks = install_hooks(models)
    runners, notes = build_runners(config, models, hooks)
    rows = {r.name: r for r in runners}
    assert type(rows["model[g=3]"].drafter).name == "cross_tokenizer"
    assert rows["hf_assisted[g=3]"].assistant_tokenizer is models.draft_tokenizer
    assert rows["hf_assisted[g=3]"].settings["universal"] is True
    # every draft token is in the target's vocabulary, where transformers' sampling path fails: greedy only, said so
    assert rows["hf_assisted[g=3]"].greedy_only and not rows["model[g=3]"].greedy_only
    sampled = BenchConfig(**{**config.as_dict(), "temperatures": (0.0, 1.0)}).resolved()
    assert any("hf_assisted runs greedy only" in n for n in build_runners(sampled, models, hooks)[1])
    assert any(n.startswith("lookup_model skipped") and "own tokenizer" in n for n in notes), notes
    ids = models.tokenizer("def add(a, b):\n", return_tensors="pt").input_ids
    outputs = {name: rows[name].run(ids, 0.0, 0, 12) for name in ("hf_generate", "model[g=3]", "hf_assisted[g=3]")}
    hooks.remove()
    assert outputs["model[g=3]"].new_ids == outputs["hf_generate"].new_ids == outputs["hf_assisted[g=3]"].new_ids
    assert outputs["model[g=3]"].drafted > 0 and outputs["model[g=3]"].stats["time_retokenize"] > 0


def test_a_conf_row_keeps_its_policy_across_prompts_one_per_temperature(model_dir):
    """Our conf / auto rows keep their length policy (timings and rates) from prompt to prompt, as a Pipeline does;
    greedy and sampled runs of the row keep one each."""
    config = BenchConfig(
        target=model_dir / "target", draft=model_dir / "draft", quick=True, gammas=("conf",), runners=("model",)
    ).resolved()
    models = load_models(config)
    hooks = install_hooks(models)
    runner = next(r for r in build_runners(config, models, hooks)[0] if r.name == "model[conf]")
    ids = models.tokenizer("def add(a, b):\n", return_tensors="pt").input_ids
    curve = {1: 0.010, 2: 0.011, 4: 0.012, 8: 0.020, 16: 0.040, 32: 0.080}  # as a llama.cpp target measures it
    runner.target.cost_curve = lambda: curve
    runner.run(ids, 0.0, 0, 12)
    policy = runner.policies.get("conf", 0.0)
    assert policy.costs.seeded  # as a Pipeline's: from the target's measured curve, before the first step
    calls = policy.costs.calls
    runner.run(ids, 0.0, 0, 12)
    hooks.remove()
    assert runner.policies.get("conf", 0.0) is policy and policy.costs.calls > calls
    assert runner.policies.get("conf", 1.0) is not policy
    assert runner.policies.get("conf", 1.0).costs is policy.costs  # one StepCosts for the row, as a Pipeline's


def test_an_eagle3_head_gives_chain_and_tree_rows_that_keep_the_greedy_text(model_dir, tmp_path):
    """With a head for the target, `--runners eagle3,eagle3_tree` gives one row per gamma of each, and the tree row
    runs (a short generation, not a measurement): its text is the target's greedy text."""
    from draftverify.drafters.eagle3_head import Eagle3Config, Eagle3Head
    from draftverify.drafters.eagle3_tree import Eagle3TreeDrafter

    config = _config(model_dir, quick=False, gammas=(3, "auto"), runners=("eagle3", "eagle3_tree"))
    target = load_models(config).target
    Eagle3Head(Eagle3Config.for_target(target.config, target.get_output_embeddings())).save(tmp_path / "head")
    options = {**config.options, "eagle3_path": tmp_path / "head"}
    config = BenchConfig(**{**config.as_dict(), "options": options}).resolved()
    models = load_models(config)
    hooks = install_hooks(models)
    runners, notes = build_runners(config, models, hooks)
    rows = {r.name: r for r in runners}
    assert {"eagle3[g=3]", "eagle3[auto]", "eagle3_tree[g=3]", "eagle3_tree[auto]"} <= set(rows), notes
    assert isinstance(rows["eagle3_tree[g=3]"].drafter, Eagle3TreeDrafter)
    ids = models.tokenizer("def add(a, b):\n", return_tensors="pt").input_ids
    outputs = {name: rows[name].run(ids, 0.0, 0, 12) for name in ("hf_generate", "eagle3_tree[g=3]")}
    hooks.remove()
    assert outputs["eagle3_tree[g=3]"].new_ids == outputs["hf_generate"].new_ids
    assert outputs["eagle3_tree[g=3]"].drafted > 0


def test_a_method_whose_piece_runs_as_gguf_gets_a_gguf_twin_on_llama_cpp_only(model_dir, tmp_path, monkeypatch):
    """`eagle3_gguf` is eagle3 with its head converted to GGUF and run in llama.cpp: a family only where the method
    declares that option; on the hf backend it is skipped with the reason; on llama.cpp its row reads the GGUF."""
    from draftverify.drafters.eagle3_head import Eagle3Config, Eagle3Head

    assert "eagle3_gguf" in families() and "eagle3_tree_gguf" not in families() and "model_gguf" not in families()
    config = _config(model_dir, gammas=(3,), runners=("eagle3", "eagle3_gguf"))
    target = load_models(config).target
    Eagle3Head(Eagle3Config.for_target(target.config, target.get_output_embeddings())).save(tmp_path / "head")
    options = {**config.options, "eagle3_path": tmp_path / "head"}
    config = BenchConfig(**{**config.as_dict(), "options": options}).resolved()
    models = load_models(config)
    rows, notes = _plan(config, models)
    assert [r.name for r in rows] == ["eagle3[g=3]"]
    assert any(n.startswith("eagle3_gguf skipped") and "--backend llamacpp" in n for n in notes), notes
    pytest.importorskip("llama_cpp", reason="the llamacpp extra is not installed")
    from draftverify.backends.gguf import converter_available, gguf_for
    from draftverify.backends.llamacpp import LlamaCppLM

    if not converter_available():
        pytest.skip("no llama.cpp converter: scripts/fetch_llama_cpp_converter.sh")
    monkeypatch.setenv("DRAFTVERIFY_GGUF_CACHE", str(tmp_path / "gguf"))
    rows, notes = plan_rows(config, models, LlamaCppLM(gguf_for(model_dir / "target"), threads=1), drafts=(None, None))
    by_name = {r.name: r for r in rows}
    assert set(by_name) == {"eagle3[g=3]", "eagle3_gguf[g=3]"}, notes
    assert str(by_name["eagle3_gguf[g=3]"].options.eagle3_path).endswith("-f16.gguf")
    assert by_name["eagle3[g=3]"].options.eagle3_path == tmp_path / "head"

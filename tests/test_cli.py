"""The command line, through its real entry point: text on stdout and statistics on stderr, every bad input an
exit-2 message (never a traceback, never after echoing the prompt), Ctrl-C an exit-130 message, fast start-up.

Most tests use typer's runner (in-process, fast); the ones about the process itself (argv bytes, signals,
imports, the hub) run the installed `draftverify` script in a subprocess.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from draftverify.cli import app
from test_api import PROMPT, model_dirs  # noqa: F401  (shared fixture)

runner = CliRunner()
SCRIPT = Path(sys.executable).with_name("draftverify")


def entry_point() -> list[str]:
    """The installed console script when present (what users run), else the same app via -m."""
    return [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "draftverify.cli"]


def run_process(args: list, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(entry_point() + args, capture_output=True, env=full_env, timeout=timeout)


def generate_args(model_dirs, *extra: str, prompt: str = PROMPT) -> list[str]:  # noqa: F811
    return ["generate", "--target", str(model_dirs / "target"), "--prompt", prompt, "-n", "8", *extra]


def test_text_goes_to_stdout_and_the_statistics_table_to_stderr(model_dirs):  # noqa: F811
    result = runner.invoke(
        app, generate_args(model_dirs, "--draft", str(model_dirs / "draft"), "--method", "model", "-n", "16")
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(PROMPT) and len(result.stdout) > len(PROMPT) + 1
    for measure in (
        "target calls",
        "mean tokens per target call",
        "acceptance rate alpha (kept / judged drafts)",
        "time: draft",
        "time: target forward",
        "loop overhead",
        "tokens / s",
    ):
        assert measure in result.stderr and measure not in result.stdout
    assert "alpha: share of the draft tokens the verifier judged" in result.stderr
    assert "loading model: target" in result.stderr


def test_generate_json_is_one_object_on_stdout_matching_the_python_api(model_dirs):  # noqa: F811
    from draftverify.api import load

    result = runner.invoke(
        app, generate_args(model_dirs, "--method", "prompt_lookup", "-n", "16", "--gamma", "auto", "--json")
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    expected = load(target=model_dirs / "target", method="autoregressive").generate(PROMPT, max_new_tokens=16)
    assert payload["text"] == expected.text
    assert payload["stats"]["new_tokens"] == 16


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--method", "nope"], "unknown method"),
        (["--method", "bild", "--alpha-fb", "1.5"], "alpha_FB"),
        (["--method", "autoregressive", "--gamma", "0"], "gamma"),
        (["--method", "autoregressive", "--temperature", "-1"], "temperature"),
        (["--method", "autoregressive", "--temperature", "inf"], "finite"),
        (["--method", "autoregressive", "-n", "0"], "max_new_tokens"),
        (["--method", "autoregressive", "--verifier", "nucleus"], "unknown verifier"),
        (["--method", "ngram", "--ngram", "README.md"], "not an n-gram table"),
        (["--method", "model_tree", "--tree-paths", "[[0], [0, 0, 0]]"], "no parent path"),
        (["--method", "model_tree", "--tree-paths", "[0, 1]"], "--tree-paths"),
        (["--method", "autoregressive", "--target-gguf", "q8_0"], "with --backend hf the target loads at --dtype"),
        (["--method", "autoregressive", "--target-gguf", "int4"], "--target-gguf) must be one of"),
        (["--method", "autoregressive", "--no-flash-attn"], "--backend hf runs torch's attention"),
    ],
)
def test_bad_inputs_exit_2_with_a_message_and_echo_nothing(model_dirs, extra, message):  # noqa: F811
    args = generate_args(model_dirs, "--draft", str(model_dirs / "draft"), *extra)
    result = runner.invoke(app, args)
    assert result.exit_code == 2, (extra, result.output)
    assert message in result.stderr, (extra, result.stderr)
    assert result.stdout == ""  # nothing echoed before the error
    assert "Traceback" not in result.output


def test_a_prompt_too_long_for_the_context_is_not_echoed_first(model_dirs):  # noqa: F811
    result = runner.invoke(app, generate_args(model_dirs, "--method", "autoregressive", prompt="x = 1\n" * 400))
    assert result.exit_code == 2, result.output
    assert "at most 512 positions" in result.stderr
    assert result.stdout == ""


def test_model_folder_without_tokenizer_files_is_an_exit_2_message(model_dirs, tmp_path):  # noqa: F811
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        if (model_dirs / "target" / name).exists():
            shutil.copy(model_dirs / "target" / name, bare / name)
    result = runner.invoke(app, ["generate", "--target", str(bare), "--method", "autoregressive", "--prompt", "x"])
    assert result.exit_code == 2, result.output
    assert "has no tokenizer files" in result.stderr and "protobuf" not in result.output


def test_ignored_settings_are_warned_about(model_dirs):  # noqa: F811
    result = runner.invoke(
        app,
        generate_args(
            model_dirs,
            "--method",
            "prompt_lookup",
            "--top-p",
            "0.9",
            "--seed",
            "1",
            "--draft",
            str(model_dirs / "draft"),
        ),
    )
    assert result.exit_code == 0, result.output
    assert "warning: --top-p, --seed: used only when sampling" in result.stderr
    assert "warning: --draft is not used by method 'prompt_lookup'" in result.stderr
    quiet = runner.invoke(
        app,
        generate_args(model_dirs, "--method", "prompt_lookup", "--temperature", "1", "--seed", "1", "--gamma", "auto"),
    )
    assert quiet.exit_code == 0 and "warning" not in quiet.stderr
    uncoupled = runner.invoke(
        app,
        generate_args(
            model_dirs,
            "--method",
            "prompt_lookup",
            "--temperature",
            "1",
            "--seed",
            "1",
            "--no-coupling",
            "--gamma",
            "auto",
        ),
    )
    assert "warning: --seed with --no-coupling and --gamma auto does not fix the text" in uncoupled.stderr


def test_the_same_seed_prints_the_same_text_for_every_method_and_gamma(model_dirs):  # noqa: F811
    texts = set()
    for extra in (
        ["--method", "autoregressive"],
        ["--method", "model", "--gamma", "auto"],
        ["--method", "lookup_model", "--gamma", "2"],
        ["--method", "prompt_lookup", "--gamma", "heuristic"],
    ):
        result = runner.invoke(
            app,
            generate_args(
                model_dirs,
                "--draft",
                str(model_dirs / "draft"),
                "--temperature",
                "0.8",
                "--seed",
                "0",
                "-n",
                "24",
                "--json",
                *extra,
            ),
        )
        assert result.exit_code == 0, result.output
        texts.add(json.loads(result.stdout)["text"])
    assert len(texts) == 1


def test_prompt_dash_reads_stdin_and_rejects_non_utf8(model_dirs):  # noqa: F811
    from_stdin = runner.invoke(app, generate_args(model_dirs, "--method", "autoregressive", prompt="-"), input=PROMPT)
    direct = runner.invoke(app, generate_args(model_dirs, "--method", "autoregressive"))
    assert from_stdin.exit_code == 0, from_stdin.output
    assert from_stdin.stdout == direct.stdout and from_stdin.stdout.startswith(PROMPT)
    bad = runner.invoke(app, generate_args(model_dirs, "--method", "autoregressive", prompt="-"), input=b"\xff\xfe")
    assert bad.exit_code == 2 and "not UTF-8" in bad.stderr and bad.stdout == ""


@pytest.mark.parametrize("prompt", ["   ", "\n\t", "-"])
def test_a_whitespace_only_prompt_exits_2_before_loading(model_dirs, prompt):  # noqa: F811
    result = runner.invoke(app, generate_args(model_dirs, "--method", "autoregressive", prompt=prompt), input=" \n ")
    assert result.exit_code == 2, result.output
    assert "only whitespace" in result.stderr and "loading" not in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_a_gamma_beyond_the_bound_exits_2_naming_the_bound(model_dirs, command):  # noqa: F811
    args = (
        generate_args(model_dirs, "--gamma", "1000")
        if command == "generate"
        else ["serve", "--target", str(model_dirs / "target"), "--gamma", "1000"]
    )
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "gamma (draft length) 1000 is above 64" in result.stderr and "loading" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("method", ["specdec", "specdec++_nat"])
def test_a_nat_method_on_a_zoo_without_a_drafter_says_which_zoo_ships_one_and_how_to_train_one(
    method, code_zoo_without_nat
):
    result = runner.invoke(app, ["generate", "--zoo", "code", "--method", method, "--prompt", "def f(x):"])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "loading" not in result.stderr, result.stderr
    assert (
        "only the translate zoo ships one" in lines[0] and "draftverify train nat --target zoo/code/target" in lines[0]
    )
    served = runner.invoke(app, ["serve", "--zoo", "code", "--method", method])
    assert served.exit_code == 2 and "only the translate zoo ships one" in served.stderr
    assert (
        "only the translate zoo ships one" in runner.invoke(app, ["generate", "--help"], env={"COLUMNS": "400"}).stdout
    )
    assert "the code and translate zoos ship one" in runner.invoke(app, ["methods"], env={"COLUMNS": "400"}).stdout


def test_serve_on_a_port_in_use_exits_2_at_once_without_loading(model_dirs):  # noqa: F811
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        result = run_process(["serve", "--target", str(model_dirs / "target"), "--port", str(port)], timeout=60)
        seconds = time.monotonic() - started
    err = result.stderr.decode()
    assert result.returncode == 2, err
    assert (
        err.strip() == f"error: port {port} on 127.0.0.1 is already in use (another server?): stop what listens "
        "there or pick a free port with --port"
    )
    assert "loading" not in err and "serving" not in err and "Errno" not in err
    assert seconds < 20  # no model load, no torch import (a few seconds of interpreter start-up on a busy machine)


def test_methods_lists_every_method():
    result = runner.invoke(app, ["methods"])
    assert result.exit_code == 0
    for name in (
        "autoregressive",
        "model",
        "prompt_lookup",
        "ngram",
        "early_exit",
        "bild",
        "specdec++",
        "model_tree",
        "prompt_lookup_tree",
        "lookup_model",
    ):
        assert name in result.output


def test_generate_with_a_tree_method_and_a_custom_shape(model_dirs):  # noqa: F811
    from draftverify.api import load

    result = runner.invoke(
        app,
        [
            "generate",
            "--target",
            str(model_dirs / "target"),
            "--draft",
            str(model_dirs / "draft"),
            "--method",
            "model_tree",
            "--tree-paths",
            "[[0], [1], [0, 0]]",
            "--prompt",
            PROMPT,
            "-n",
            "12",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    expected = load(target=model_dirs / "target", method="autoregressive").generate(PROMPT, max_new_tokens=12)
    assert payload["text"] == expected.text
    calls, drafted = payload["stats"]["target_calls"], payload["stats"]["drafted_tokens"]
    assert 3 * (calls - 1) <= drafted <= 3 * calls  # the 3-node shape (only the last step may be cut to depth 1)


@pytest.mark.parametrize("flag, lean", [([], True), (["--no-lean-draft"], False)])
def test_generate_lean_draft_switch(model_dirs, monkeypatch, flag, lean):  # noqa: F811
    import draftverify.api as api

    real, seen = api.load, {}

    def load(**kwargs):
        seen["pipe"] = real(**kwargs)
        return seen["pipe"]

    monkeypatch.setattr(api, "load", load)
    result = runner.invoke(
        app,
        [
            "generate",
            "--target",
            str(model_dirs / "target"),
            "--draft",
            str(model_dirs / "draft"),
            "--method",
            "model",
            "--prompt",
            PROMPT,
            "-n",
            "12",
            "--gamma",
            "3",
            "--json",
            *flag,
        ],
    )
    assert result.exit_code == 0, result.output
    assert (seen["pipe"].drafter.lm.name == "lean") == lean
    expected = real(target=model_dirs / "target", method="autoregressive").generate(PROMPT, max_new_tokens=12)
    assert json.loads(result.stdout)["text"] == expected.text


def test_generate_compiled_gives_the_same_text(model_dirs):  # noqa: F811
    from draftverify.api import load

    result = runner.invoke(
        app,
        [
            "generate",
            "--target",
            str(model_dirs / "target"),
            "--method",
            "prompt_lookup",
            "--compile",
            "--prompt",
            PROMPT,
            "-n",
            "8",
            "--gamma",
            "3",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    expected = load(target=model_dirs / "target", method="autoregressive").generate(PROMPT, max_new_tokens=8)
    assert json.loads(result.stdout)["text"] == expected.text
    # it says what it compiles (a plain step and gamma + 1 wide: the widths gamma 3 uses), each graph, the time,
    # and whether compiling paid off (it cannot, for 8 tokens)
    err = result.stderr
    assert "compiling 2 graphs with torch.compile before generating (target at widths 1, 4)" in err
    assert "compiled graph 1/2: target at width 1" in err and "compiled graph 2/2: target at width 4" in err
    assert "compiled 2 graphs in " in err
    assert (
        "warning: --compile pays off only over many generations in one process" in err
        or "warning: --compile does not pay off on this machine" in err
    )


# ---- the real process -------------------------------------------------------------------------------------


def test_help_version_methods_and_argument_errors_never_import_torch():
    """What makes them fast: the CLI module and the argument checks import neither torch nor transformers."""
    code = (
        "import sys; from typer.testing import CliRunner; from draftverify.cli import app; r = CliRunner();"
        "codes = [r.invoke(app, a).exit_code for a in (['--help'], ['--version'], ['methods'],"
        " ['generate', '--prompt', 'x', '--temperature', 'inf'], ['generate', '--prompt', 'x', '--gamma', 'fast'])];"
        "print(codes, 'torch' in sys.modules, 'transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[0, 0, 0, 2, 2] False False", out.stderr
    version = run_process(["--version"])
    assert version.returncode == 0 and version.stdout.decode().startswith("draftverify 0.")


def test_non_utf8_prompt_argument_is_an_exit_2_message(model_dirs):  # noqa: F811
    result = run_process(["generate", "--target", str(model_dirs / "target"), "--prompt", b"\xff\xfe"])
    assert result.returncode == 2, result.stderr
    assert b"unpaired surrogate" in result.stderr and b"Traceback" not in result.stderr
    assert result.stdout == b""


def test_hub_id_with_the_hub_unreachable_fails_at_once_with_a_message(tmp_path):
    env = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf")}  # port 9: connection refused
    result = run_process(["generate", "--target", "gpt2", "--method", "autoregressive", "--prompt", "x"], env=env)
    assert result.returncode == 2, result.stderr
    err = result.stderr.decode()
    assert "the Hugging Face hub cannot be reached" in err and "not in the local cache" in err
    assert "Traceback" not in err and "Retrying" not in err and "retry" not in err.lower()


# The real `draftverify generate`, with api.load held open until the signal comes: where Ctrl-C lands must not
# depend on how fast this machine loads a tiny model (a fresh clone once finished loading first).
HELD_LOAD = """
import sys, time
import draftverify.api as api
real_load = api.load
def held_load(*args, **kwargs):
    sys.stderr.write("LOAD-ENTERED\\n"); sys.stderr.flush()
    time.sleep(60)
    return real_load(*args, **kwargs)
api.load = held_load
from draftverify.cli import app
sys.argv = ["draftverify", *sys.argv[1:]]
app()
"""


def test_ctrl_c_while_loading_exits_130_without_a_traceback(model_dirs):  # noqa: F811
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # the child starts with Ctrl-C's default disposition, as a terminal gives it: pytest run as a background job
    # (`... &` in a script) ignores SIGINT, a child inherits that, and Python then installs no KeyboardInterrupt
    # handler (the cause of this test's failures in fresh clones tested in the background)
    proc = subprocess.Popen(
        [sys.executable, "-c", HELD_LOAD, *generate_args(model_dirs, "--method", "autoregressive")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    status = b""
    while b"LOAD-ENTERED" not in status:
        chunk = proc.stderr.read1(256)
        assert chunk or proc.poll() is None, status
        status += chunk
    start = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    err = status + err
    assert proc.returncode == 130, err
    assert time.monotonic() - start < 30  # the signal ended the held load, not the load's end
    assert b"loading autoregressive" in err and b"interrupted" in err and b"Traceback" not in err
    assert out == b""


def test_transformers_warnings_do_not_reach_the_user(model_dirs, tmp_path):  # noqa: F811
    """A tokenizer whose nominal maximum is below the prompt makes transformers log "Token indices sequence
    length is longer than ..."; the model itself attends to 512 positions, so the run is fine and quiet."""
    short = tmp_path / "short"
    shutil.copytree(model_dirs / "target", short)
    config = json.loads((short / "tokenizer_config.json").read_text())
    (short / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 8}))
    result = run_process(
        ["generate", "--target", str(short), "--method", "autoregressive", "-n", "4", "--prompt", PROMPT * 4],
        env={"TRANSFORMERS_VERBOSITY": ""},
    )
    assert result.returncode == 0, result.stderr
    assert b"Token indices" not in result.stderr and b"Warning" not in result.stderr


def test_prompts_file_runs_batches_and_prints_one_json_line_per_prompt(model_dirs, tmp_path):  # noqa: F811
    from draftverify.api import load

    prompts = [PROMPT, "import os\n", "x = 1\n", "class A:\n    pass\n\n"]
    jsonl = tmp_path / "prompts.jsonl"
    jsonl.write_text("\n".join(json.dumps(p) if i % 2 else json.dumps({"prompt": p}) for i, p in enumerate(prompts)))
    result = runner.invoke(
        app,
        [
            "generate",
            "--target",
            str(model_dirs / "target"),
            "--draft",
            str(model_dirs / "draft"),
            "--method",
            "model",
            "--prompts-file",
            str(jsonl),
            "--batch-size",
            "3",
            "-n",
            "12",
        ],
    )
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    pipe = load(target=model_dirs / "target", method="autoregressive")
    assert [line["prompt"] for line in lines] == prompts and [line["index"] for line in lines] == [0, 1, 2, 3]
    assert [line["text"] for line in lines] == [pipe.generate(p, max_new_tokens=12).text for p in prompts]
    assert "target calls" in result.stderr
    plain = tmp_path / "prompts.txt"
    plain.write_text("def f(x):\n\nimport sys\n")
    result = runner.invoke(
        app, ["generate", "--target", str(model_dirs / "target"), "--prompts-file", str(plain), "-n", "4", "--json"]
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert [r["prompt"] for r in payload["results"]] == ["def f(x):", "import sys"]
    assert payload["stats"]["new_tokens"] == 8


@pytest.mark.parametrize(
    "args, message",
    [
        (["--prompt", "x", "--prompts-file", "p.txt"], "exactly one of --prompt and --prompts-file"),
        ([], "exactly one of --prompt and --prompts-file"),
        (["--prompts-file", "missing.txt"], "cannot read --prompts-file"),
        (["--prompts-file", "p.txt", "--batch-size", "0"], "--batch-size must be >= 1"),
        (["--prompts-file", "bad.jsonl"], "bad.jsonl:1 is not JSON"),
        (["--prompts-file", "p.txt", "--method", "bild", "--draft", "DRAFT"], "one row at a time"),
    ],
)
def test_prompts_file_errors(model_dirs, tmp_path, monkeypatch, args, message):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.txt").write_text("a\nb\n")
    (tmp_path / "bad.jsonl").write_text("{nope\n")
    args = [str(model_dirs / "draft") if a == "DRAFT" else a for a in args]
    result = runner.invoke(app, ["generate", "--target", str(model_dirs / "target"), "-n", "4", *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--target", "x", "--max-batch", "0"], "--max-batch must be >= 1"),
        (["--target", "x", "--port", "70000"], "--port must be in 0..65535"),
        (["--target", "x", "--stream-interval", "-1"], "--stream-interval must be in 0..10 seconds"),
        ([], "no model: give --zoo NAME or --target PATH"),
        (["--zoo", "nope"], "no zoo entry 'nope'"),
    ],
)
def test_serve_argument_errors_exit_2(args, message):
    result = runner.invoke(app, ["serve", *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr


def test_serve_without_the_serve_extra_says_how_to_install_it(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "uvicorn" else real(name, *a))
    result = runner.invoke(app, ["serve", "--target", "x"])
    assert result.exit_code == 2, result.output
    assert "pip install 'draftverify[serve]'" in result.stderr


# ---------------------------------------------------------------- token healing (--heal / --no-heal)

DOCSTRING_PROMPT = (
    'def is_palindrome(text: str) -> bool:\n    """Return True if text reads the same backwards.\n'
    '    >>> is_palindrome("aba")\n    True\n    """\n'
)


def test_zoo_heals_a_prompt_ending_in_a_newline_by_default_and_no_heal_does_not():
    """The code zoo's byte-level BPE merges "\\n" with the next line's indentation, so a bare final "\\n" is a state
    the target never saw: unhealed it starts a new top-level statement; healed, the first token is "\\n   " (then
    " if") and the function body follows. --json text and the streamed stdout are relative to the prompt as given."""
    from draftverify.api import load

    texts = {}
    for flag in ("", "--heal", "--no-heal"):
        args = ["generate", "--zoo", "code", "--prompt", DOCSTRING_PROMPT, "-n", "10", "--json"] + (
            [flag] if flag else []
        )
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        texts[flag] = json.loads(result.stdout)["text"]
    assert texts[""] == texts["--heal"] != texts["--no-heal"]
    assert texts["--heal"].startswith("    ") and not texts["--no-heal"].startswith("    ")
    pipe = load(zoo="code", method="autoregressive")
    healed = pipe.generate(DOCSTRING_PROMPT, max_new_tokens=10, heal=True)
    plain = pipe.generate(DOCSTRING_PROMPT, max_new_tokens=10, heal=False)
    assert (healed.text, plain.text) == (texts["--heal"], texts["--no-heal"])  # lossless: the method changes nothing
    first = [int(r.output.new_tokens[0, 0]) for r in (healed, plain)]
    assert first[0] != first[1] and pipe.tokenizer.decode(first[0:1]) == "\n   "  # then " if": the body
    streamed = runner.invoke(app, ["generate", "--zoo", "code", "--prompt", DOCSTRING_PROMPT, "-n", "10"])
    assert streamed.exit_code == 0 and streamed.stdout == DOCSTRING_PROMPT + texts["--heal"] + "\n"


def test_the_code_zoo_runs_earn_by_default_and_its_text_is_the_targets_greedy_text():
    """Without --method, `generate --zoo code` runs the zoo's default (earn: each step the draft that earns most),
    which is lossless: its text is the target's own greedy text."""
    from draftverify.api import load

    result = runner.invoke(app, ["generate", "--zoo", "code", "--prompt", "def fibonacci(n):", "-n", "24", "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["method"] == "earn"
    plain = load(zoo="code", method="autoregressive").generate("def fibonacci(n):", max_new_tokens=24, heal=True)
    assert record["text"] == plain.text  # (a zoo heals the prompt's last token by default)


def test_heal_is_off_without_a_zoo_unless_asked(model_dirs):  # noqa: F811
    from draftverify.api import load

    prompt = 'def add(a, b):\n    """Add two numbers."""\n'
    pipe = load(target=model_dirs / "target", method="autoregressive")
    for flags, heal in (([], False), (["--heal"], True), (["--no-heal"], False)):
        result = runner.invoke(
            app, generate_args(model_dirs, "--method", "autoregressive", "--json", *flags, prompt=prompt)
        )
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["text"] == pipe.generate(prompt, max_new_tokens=8, heal=heal).text, flags

"""The `draftverify bench` group: the harness a user reruns against peers, one suite per subcommand (SUITES:
speed, batch, serve, serve-llamacpp, overhead, cold-start, ab, rounds, native, synthetic, replay, samples). Typer
functions only, each running its module of bench/ (the speed suite's flags are in speed_command.py); cli.py adds
bench_app. Nothing heavy is imported here, so --help stays fast."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Callable, List, Optional

import typer
from rich.console import Console
from rich.markup import escape

from ..backends import DRAFT_GGUF_TYPES
from ..checks import check_max_new_tokens, gamma_flag
from ..cli_help import flag, one_row_methods
from ..draft_length import DEFAULT_GAMMA, parse_gamma
from ..errors import DraftVerifyError
from ..quiet import quiet_process
from . import folders
from .speed_command import speed
from .versus_native import (
    DEFAULT_GAMMAS as NATIVE_GAMMAS,
    DEFAULT_METHODS as NATIVE_METHODS,
    DEFAULT_PROMPT_SETS as NATIVE_PROMPT_SETS,
    DEFAULT_TARGET_GGUFS as NATIVE_TARGET_GGUFS,
)

console = Console()
err_console = Console(stderr=True, soft_wrap=True)


def recorded_command(ctx: typer.Context, always: tuple[str, ...] = ("out", "name")) -> str:
    """The running command as parsed (not sys.argv, which is the caller's when invoked in-process): every option
    given a value other than its default, and `always` ones whatever their value; secrets (--api-key) as KEY."""
    argv = ["draftverify", *ctx.command_path.split()[1:]]  # the group too: draftverify bench ab
    for param in ctx.command.params:
        if not getattr(param, "opts", None) or param.param_type_name != "option":
            continue
        value = ctx.params.get(param.name)
        if value is None or (value == param.default and param.name not in always) or value == []:
            continue
        if param.name == "api_key":
            value = "KEY"
        if param.is_flag and param.secondary_opts:
            argv.append(param.opts[0] if value else param.secondary_opts[0])
        elif param.is_flag:
            if value:
                argv.append(param.opts[0])
        elif isinstance(value, (list, tuple)):
            argv += [a for v in value for a in (param.opts[0], str(v))]
        else:
            argv += [param.opts[0], str(value)]
    return shlex.join(argv)


def exit_2_on_error(run: Callable[[], dict]) -> dict:
    """Run a bench; a DraftVerifyError is one red line and exit 2."""
    try:
        return run()
    except DraftVerifyError as err:
        err_console.print(f"[red]error:[/red] {escape(str(err))}")
        raise typer.Exit(2) from None


def run_reporting(run: Callable[[], dict]) -> dict:
    """Run a bench (exit_2_on_error); print the files written."""
    result = exit_2_on_error(run)
    for path in result["files"].values():
        print(f"wrote {path}")
    return result


def echo(line: str) -> None:
    err_console.print(f"[dim]{escape(line)}[/dim]")


def bench_batch(
    zoo: Optional[str] = flag(None, "--zoo", help="Shipped model set, e.g. 'code'."),
    target: Optional[str] = flag(None, "--target", "-t"),
    draft: Optional[str] = flag(None, "--draft", "-d"),
    methods_: str = flag(
        "lookup_model",
        "--methods",
        help="Comma list of our drafting methods to run besides hf_generate and ours_autoregressive (methods that "
        f"batch: every method but {one_row_methods()}), each at --gamma or at its own draft length: METHOD[auto], "
        "METHOD[heuristic], METHOD[conf], METHOD[g=N] (e.g. 'lookup_model,lookup_model[auto]').",
    ),
    gamma: str = flag(
        str(DEFAULT_GAMMA),
        "--gamma",
        help="Draft length of the methods listed without one: an integer, 'auto' (Theorem 8 for the step's batch size; "
        "may choose 0, no draft), 'conf[=T]' or 'heuristic'.",
    ),
    batch_sizes: str = flag("1,2,4,8", "--batch-sizes"),
    prompts: str = flag(
        "humaneval",
        "--prompts",
        help="humaneval, spec_bench, spec_bench:<category>,"
        " or your own prompts: a .jsonl file whose records have a 'prompt' field,"
        " or a text file with one prompt per line.",
    ),
    data_dir: Optional[Path] = flag(None, "--data-dir"),
    num_prompts: int = flag(16, "--num-prompts", help="Prompts decoded at every batch size (at least the largest B)."),
    max_new_tokens: int = flag(128, "--max-new-tokens", "-n"),
    threads: Optional[int] = flag(None, "--threads"),
    out: Path = flag(folders.BATCH, "--out"),
    name: str = flag("bench-batch", "--name", help="Writes OUT/NAME.json and OUT/NAME.md."),
) -> None:
    """Batch throughput: tokens/s at batch sizes 1, 2, 4, 8 for HF generate (batched), our loop without drafting
    and our drafting methods, greedy, on the same prompts; checks every row equals its batch-1 text."""
    try:
        from .batch import main as batch_main, parse_sizes

        if zoo is None and target is None:
            raise DraftVerifyError("no model: give --zoo NAME or --target PATH")
        check_max_new_tokens(max_new_tokens)
        quiet_process()
        results = batch_main(
            zoo,
            target,
            draft,
            [m for m in methods_.split(",") if m],
            parse_sizes(batch_sizes),
            prompts,
            num_prompts,
            max_new_tokens,
            out,
            name,
            threads,
            data_dir,
            echo=lambda line: err_console.print(escape(line)),
            gamma=gamma_flag(gamma),
        )
    except DraftVerifyError as err:
        err_console.print(f"[red]error:[/red] {escape(str(err))}")
        raise typer.Exit(2) from None
    console.print(f"wrote {out / name}.json and {out / name}.md")
    differ = [f"{r.runner} B={r.batch_size}" for r in results if r.equal_rows is not None and r.equal_rows < r.prompts]
    if differ:
        err_console.print(
            f"[yellow]warning:[/yellow] rows differ from their batch-1 text in {', '.join(differ)} "
            "(float rounding of batched matrix products can flip near-ties; see the last column)"
        )


def bench_ab(
    ctx: typer.Context,
    vary: List[str] = typer.Option(
        ...,
        "--vary",
        help="NAME=V1,V2,...: a public option and the values to compare "
        "(repeat for several; the settings are every combination, the first is the "
        "reference). NAME: method, draft, gamma, dtype, backend, draft_gguf or a declared "
        "method option (e.g. lookup_confirms=false,true; lookup_tokens=0,5).",
    ),
    set_: List[str] = typer.Option(
        [],
        "--set",
        help="NAME=VALUE: an option every setting shares (repeatable), as "
        "--vary names them, e.g. --set backend=llamacpp --set gamma=conf.",
    ),
    zoo: str = typer.Option(
        "code", "--zoo", help="Shipped model set (its target; its draft for methods that take one)."
    ),
    target: Optional[str] = typer.Option(None, "--target", "-t", help="Target model directory (instead of the zoo's)."),
    prompts: str = typer.Option(
        "humaneval",
        "--prompts",
        help="humaneval, spec_bench, spec_bench:<category>,"
        " or your own prompts: a .jsonl file whose records have a 'prompt' field,"
        " or a text file with one prompt per line.",
    ),
    data_dir: Optional[Path] = typer.Option(
        None, "--data-dir", help="Folder holding the prompt sets (default: the shipped copies)."
    ),
    first: int = typer.Option(
        0,
        "--first",
        help="First prompt: a choice made on the bench's prompts (0-7) can be checked on others, e.g. --first 100.",
    ),
    num_prompts: int = typer.Option(8, "--num-prompts", min=1),
    rounds: int = typer.Option(3, "--rounds", help="Rounds over the prompts; ratios are medians over rounds."),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", "-n", min=1),
    warmup_tokens: int = typer.Option(
        32, "--warmup-tokens", help="Tokens of one warm-up generation per setting (0: none)."
    ),
    threads: Optional[int] = typer.Option(None, "--threads", min=1, help="CPU threads for torch (and llama.cpp)."),
    check_text: bool = typer.Option(
        True,
        "--check-text/--no-check-text",
        help="Stop when the settings give "
        "different texts (lossless settings must not); off for settings that change "
        "the output (dtype, backend).",
    ),
    structured: Optional[str] = typer.Option(
        None,
        "--structured",
        help="KIND=VALUE: every setting decodes under this structured output: json_schema=JSON, regex=RE, "
        "grammar=EBNF (VALUE or @FILE), json_object=true (the structured extra: xgrammar).",
    ),
    out: Path = typer.Option(folders.DRAFT_POLICY, "--out", help="Folder of NAME.json and NAME.md."),
    name: str = typer.Option("ab", "--name", help="File stem."),
) -> None:
    """Settings of one method side by side in one process: each a pipeline of its own, every setting on every
    prompt, the order rotated prompt by prompt; tok/s, its ratio to the first setting, tokens per call."""
    from .ab import ABConfig, parse_assignments, parse_structured, render, run_ab

    command = recorded_command(ctx)

    def run() -> dict:
        fixed = {k: v[0] for k, v in parse_assignments(set_, many=False).items()}
        cfg = ABConfig(
            vary=parse_assignments(vary, many=True),
            fixed=fixed,
            zoo=zoo,
            target=target,
            prompts=prompts,
            data_dir=data_dir,
            first=first,
            num_prompts=num_prompts,
            rounds=rounds,
            max_new_tokens=max_new_tokens,
            warmup_tokens=warmup_tokens,
            threads=threads,
            check_text=check_text,
            structured=None if structured is None else parse_structured(structured),
            out=out,
            name=name,
            command=command,
        )
        return run_ab(cfg, echo=echo)

    print(render(run_reporting(run)))


def bench_rounds(
    ctx: typer.Context,
    pairs: Optional[str] = typer.Option(
        None,
        "--pairs",
        help="Comma list of OURS/PEER bench row names (default: "
        "ours on llama.cpp against llama.cpp plain and its prompt lookup, with the "
        "zoo draft and the aligned one, and model at gamma conf against hf_assisted "
        "at its defaults); the rows' names are the bench's, as its summary prints "
        "them.",
    ),
    rounds: int = typer.Option(5, "--rounds"),
    num_prompts: int = typer.Option(8, "--num-prompts", min=1),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", "-n", min=1),
    gamma: str = typer.Option(
        "conf,conf=0.9",
        "--gamma",
        help="Comma list of the draft lengths our rows are built at (a pair names rows at these).",
    ),
    backend: str = typer.Option("hf,llamacpp", "--backend", help="Comma list of what runs our rows: hf, llamacpp."),
    zoo: str = typer.Option("code", "--zoo"),
    target: Optional[str] = typer.Option(None, "--target", "-t", help="Target model directory (instead of the zoo's)."),
    draft: Optional[str] = typer.Option(None, "--draft", "-d", help="Draft model (instead of the zoo's)."),
    aligned_draft: Optional[str] = typer.Option(None, "--aligned-draft", help="Aligned draft (model_aligned rows)."),
    data_dir: Optional[Path] = typer.Option(
        None, "--data-dir", help="Folder holding humaneval/ (default: the shipped copy)."
    ),
    threads: Optional[int] = typer.Option(2, "--threads", min=1),
    out: Path = typer.Option(folders.SPEED, "--out", help="Folder of NAME.json and NAME.md."),
    name: str = typer.Option("bench-rounds", "--name", help="File stem."),
) -> None:
    """Head-to-head ratios of bench rows over several rounds in one process, each with its range over rounds."""
    from .config import ModelChoice, parse_gammas, parse_names
    from .rounds import DEFAULT_PAIRS, parse_pairs, run_rounds

    command = recorded_command(ctx)
    run_reporting(
        lambda: run_rounds(
            parse_pairs(pairs or ",".join(DEFAULT_PAIRS)),
            rounds,
            num_prompts,
            max_new_tokens,
            parse_gammas(gamma),
            parse_names("--backend", backend),
            ModelChoice(zoo, target, draft, aligned_draft, data_dir),
            threads,
            out,
            name,
            command,
            echo,
        )
    )


def bench_native(
    ctx: typer.Context,
    prompts: str = typer.Option(
        ",".join(NATIVE_PROMPT_SETS),
        "--prompts",
        help="Comma list of prompt sets, each its own cell (humaneval, spec_bench:<category>, or a prompt file).",
    ),
    target_gguf: str = typer.Option(
        ",".join(NATIVE_TARGET_GGUFS),
        "--target-gguf",
        help="Comma list of the target's GGUF types, each its own cells.",
    ),
    methods: str = typer.Option(
        ",".join(NATIVE_METHODS),
        "--methods",
        help="Comma list of our methods swept on the llama.cpp backend (each at every --gamma).",
    ),
    gamma: str = typer.Option(",".join(NATIVE_GAMMAS), "--gamma", help="Comma list of our rows' draft lengths."),
    native: str = typer.Option(
        "llamacpp_native[sweep]",
        "--native",
        help="Comma list of llama.cpp's rows swept: llamacpp_native[...] settings, or llamacpp_native[sweep] "
        "(draft-simple's n_max and p_min with both drafts, the n-gram drafters, their chains).",
    ),
    rounds: int = typer.Option(3, "--rounds", help="Rounds of the finalists after the sweep; speeds are medians."),
    finalists: int = typer.Option(2, "--finalists", help="Fastest rows of each side in the sweep that run rounds."),
    num_prompts: int = typer.Option(8, "--num-prompts", min=1),
    max_new_tokens: int = typer.Option(96, "--max-new-tokens", "-n", min=1),
    zoo: str = typer.Option("code", "--zoo"),
    target: Optional[str] = typer.Option(None, "--target", "-t", help="Target model directory (instead of the zoo's)."),
    draft: Optional[str] = typer.Option(None, "--draft", "-d", help="Draft model (instead of the zoo's)."),
    aligned_draft: Optional[str] = typer.Option(None, "--aligned-draft", help="Aligned draft (model_aligned rows)."),
    data_dir: Optional[Path] = typer.Option(
        None, "--data-dir", help="Folder holding the prompt sets (default: the shipped copies)."
    ),
    threads: Optional[int] = typer.Option(2, "--threads", min=1),
    out: Path = typer.Option(folders.SPEED, "--out", help="Folder of NAME.json and NAME.md."),
    name: str = typer.Option("bench-native", "--name", help="File stem; a rerun resumes the cells it holds."),
    fresh: bool = typer.Option(
        False,
        "--fresh",
        help="Measure every cell again, even those OUT/NAME.json holds from a run with the same settings (a rerun "
        "after a code change: resuming keeps the old code's cells).",
    ),
    flash_attn: Optional[bool] = typer.Option(
        None,
        "--flash-attn/--no-flash-attn",
        help="llama.cpp's flash attention on both sides (our rows and llama-server's); default on, as llama.cpp "
        "runs it. Off, with our rows on a library without llamafile's kernels (LLAMA_CPP_LIB_PATH), every chain of "
        "ours is exact on a quantized file.",
    ),
) -> None:
    """Our best exact row against llama.cpp's best native row (its own llama-server, settings swept) per prompt
    set and target GGUF type: a sweep, then rounds of each side's fastest rows; exactness checked row by row."""
    from .config import ModelChoice, parse_gammas, parse_names, split_top_level
    from .versus_native import Sweep, run_versus

    command = recorded_command(ctx)
    run_reporting(
        lambda: run_versus(
            tuple(parse_names("--prompts", prompts)),
            tuple(parse_names("--target-gguf", target_gguf)),
            Sweep(
                tuple(parse_names("--methods", methods)),
                parse_gammas(gamma),
                tuple(split_top_level("--native", native)),
                rounds,
                finalists,
                num_prompts,
                max_new_tokens,
            ),
            ModelChoice(zoo, target, draft, aligned_draft, data_dir),
            threads,
            out,
            name,
            command,
            echo,
            fresh,
            flash_attn,
        )
    )


def bench_synthetic(
    ctx: typer.Context,
    shapes: str = typer.Option(
        "qwen2.5-0.5b,llama-3.2-1b", "--shapes", help="Comma list of model shapes (random weights, made once)."
    ),
    target_gguf: str = typer.Option("q8_0,q4_k_m", "--target-gguf", help="Comma list of the target's GGUF types."),
    alpha: str = typer.Option(
        "0.5,0.7,0.8,0.9", "--alpha", help="Comma list of acceptance rates: each drafted token kept with this chance."
    ),
    gamma: str = typer.Option(
        "4,auto",
        "--gamma",
        help="Comma list of our draft lengths: whole numbers, or auto (the cost model's length from this run's "
        "measured acceptance and verify cost).",
    ),
    native_n_max: str = typer.Option(
        "2,4", "--native-n-max", help="Comma list of llama.cpp's draft lengths (its --spec-draft-n-max)."
    ),
    rounds: int = typer.Option(3, "--rounds", help="Rounds over the prompts; speeds are medians."),
    num_prompts: int = typer.Option(4, "--num-prompts", min=1),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", "-n", min=1),
    threads: Optional[int] = typer.Option(2, "--threads", min=1),
    out: Path = typer.Option(folders.SPEED, "--out", help="Folder of NAME.json and NAME.md."),
    name: str = typer.Option("bench-synthetic", "--name", help="File stem."),
) -> None:
    """Our loop against llama.cpp's on random-weight models with the shapes of common small models, acceptance
    drawn at the same rates on both sides (benchmarking only: the text is not the target's)."""
    from .config import parse_names
    from .synthetic import SideLengths, run_synthetic

    command = recorded_command(ctx)

    def lengths(flag: str, text: str) -> tuple:
        return tuple(int(x) if x.lstrip("-").isdigit() else x for x in parse_names(flag, text))

    def run() -> dict:
        try:
            alphas = tuple(float(a) for a in parse_names("--alpha", alpha))
        except ValueError:
            raise DraftVerifyError(f"--alpha takes a comma list of numbers in [0, 1], got {alpha!r}") from None
        return run_synthetic(
            parse_names("--shapes", shapes),
            parse_names("--target-gguf", target_gguf),
            alphas,
            SideLengths(lengths("--gamma", gamma), lengths("--native-n-max", native_n_max)),
            rounds,
            num_prompts,
            max_new_tokens,
            threads,
            out,
            name,
            command,
            echo,
        )

    run_reporting(run)


def bench_cold_start(
    ctx: typer.Context,
    configs: Optional[str] = typer.Option(
        None,
        "--configs",
        help="Comma list of METHOD or METHOD:GAMMA, or "
        "`default` (the zoo's method); the first is the reference (default: "
        "autoregressive, "
        "default, and model, prompt_lookup, lookup_model at gamma 4 and auto).",
    ),
    runs: int = typer.Option(5, "--runs", help="Fresh processes per configuration and prompt."),
    prompts: int = typer.Option(2, "--prompts", help="How many of the two built-in prompts."),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", "-n", min=1),
    threads: int = typer.Option(2, "--threads", min=1),
    zoo: str = typer.Option("code", "--zoo"),
    target: Optional[str] = typer.Option(None, "--target", "-t", help="Target model directory (instead of the zoo's)."),
    draft: Optional[str] = typer.Option(None, "--draft", "-d", help="Draft model, with --target."),
    out: Path = typer.Option(folders.SPEED, "--out", help="Folder of NAME.json and NAME.md."),
    name: str = typer.Option("cold-start", "--name", help="File stem."),
) -> None:
    """A user's first call: one `draftverify generate` per fresh process, tok/s per method and draft length as a
    ratio to the first configuration's, configurations interleaved run by run."""
    from .cold_start import DEFAULT_CONFIGS, run_cold_start

    command = recorded_command(ctx)
    chosen = tuple(c.strip() for c in configs.split(",") if c.strip()) if configs is not None else DEFAULT_CONFIGS
    result = run_reporting(
        lambda: run_cold_start(
            chosen, runs, prompts, max_new_tokens, threads, zoo, out, name, command, echo, target, draft
        )
    )
    print(Path(result["files"]["markdown"]).read_text())


def bench_overhead(
    ctx: typer.Context,
    methods_: Optional[str] = typer.Option(
        None,
        "--methods",
        help="Comma list of methods (default: autoregressive,model,prompt_lookup,early_exit,bild,specdec++ on hf; "
        "autoregressive,prompt_lookup,suffix,model on llamacpp).",
    ),
    zoo: str = typer.Option("code", "--zoo"),
    target: Optional[str] = typer.Option(None, "--target", "-t", help="Target model directory (instead of the zoo's)."),
    draft: Optional[str] = typer.Option(None, "--draft", "-d"),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", "-n", min=1),
    threads: Optional[int] = typer.Option(
        None, "--threads", min=1, help="CPU threads (default: 1 on hf, every core on llamacpp)."
    ),
    out: Path = typer.Option(folders.COST, "--out", help="Folder of NAME.json and NAME.md."),
    name: Optional[str] = typer.Option(
        None, "--name", help="File stem (default loop-overhead, loop-overhead-llamacpp with --backend llamacpp)."
    ),
    backend: str = typer.Option(
        "hf",
        "--backend",
        help="hf: each method's share of wall time outside model forwards, from its own timers. llamacpp: our time "
        "outside llama_decode per token and per step beside a bare ctypes loop over the same library and file, "
        "runners interleaved prompt by prompt.",
    ),
    target_gguf: Optional[str] = typer.Option(
        None, "--target-gguf", help="--backend llamacpp: the GGUF type the target is converted at (e.g. q8_0)."
    ),
    prompts: str = typer.Option(
        "humaneval", "--prompts", help="--backend llamacpp: the prompt set (humaneval, spec_bench, or a file)."
    ),
    num_prompts: int = typer.Option(8, "--num-prompts", min=1, help="--backend llamacpp: prompts taken."),
    rounds: int = typer.Option(2, "--rounds", min=1, help="--backend llamacpp: passes over the prompts."),
    gamma: Optional[str] = typer.Option(
        None,
        "--gamma",
        help=f"--backend llamacpp: the drafting methods' draft length (default {DEFAULT_GAMMA}; conf or auto add the "
        "length policy's own work to each step).",
    ),
) -> None:
    """The decoding loop's own share of wall time per method: the time outside model forwards (--backend hf), or
    outside llama_decode beside a bare loop over llama.cpp (--backend llamacpp)."""
    import os

    from .config import ModelChoice
    from .overhead import DEFAULT_METHODS
    from .overhead_llamacpp import DEFAULT_METHODS as LLAMACPP_METHODS

    command = recorded_command(ctx)
    if methods_ is None:
        methods_ = ",".join(LLAMACPP_METHODS if backend == "llamacpp" else DEFAULT_METHODS)
    chosen = tuple(m.strip() for m in methods_.split(",") if m.strip())
    choice = ModelChoice(zoo, target, draft)
    if backend not in ("hf", "llamacpp"):
        raise typer.BadParameter(f"must be hf or llamacpp, got {backend!r}", param_hint="--backend")
    if backend == "llamacpp":
        from .overhead_llamacpp import run_overhead_llamacpp

        if gamma is not None:
            try:
                gamma = parse_gamma(gamma)
            except DraftVerifyError as err:
                raise typer.BadParameter(str(err), param_hint="--gamma") from err

        result = run_reporting(
            lambda: run_overhead_llamacpp(
                chosen,
                choice,
                max_new_tokens,
                threads or os.cpu_count() or 1,
                target_gguf,
                prompts,
                num_prompts,
                rounds,
                out,
                name or "loop-overhead-llamacpp",
                command,
                gamma=gamma if gamma is not None else DEFAULT_GAMMA,
            )
        )
    else:
        for given, flag in ((target_gguf, "--target-gguf"), (gamma, "--gamma")):
            if given is not None:
                raise typer.BadParameter("applies to --backend llamacpp only", param_hint=flag)
        from .overhead import run_overhead

        result = run_reporting(
            lambda: run_overhead(
                chosen, choice, max_new_tokens, threads or 1, None, out, name or "loop-overhead", command
            )
        )
    print(Path(result["files"]["markdown"]).read_text())


def bench_samples(
    ctx: typer.Context,
    num_prompts: int = typer.Option(12, "--num-prompts", min=1),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", "-n", min=1),
    zoo: str = typer.Option("code", "--zoo"),
    target: Optional[str] = typer.Option(None, "--target", "-t", help="Target model directory (instead of the zoo's)."),
    data_dir: Optional[Path] = typer.Option(
        None, "--data-dir", help="Folder holding humaneval/ (default: the shipped copy)."
    ),
    out: Path = typer.Option(folders.METHODS, "--out", help="Folder of NAME.md."),
    name: str = typer.Option("humaneval-samples", "--name", help="File stem."),
) -> None:
    """The target's greedy HumanEval completions, cut at HumanEval's stop sequences, each marked by whether it
    ends on its own within the token budget."""
    from .samples import run_samples

    command = recorded_command(ctx)
    result = run_reporting(lambda: run_samples(num_prompts, max_new_tokens, zoo, target, out, name, command, data_dir))
    ended = sum(s["ends_on_its_own"] for s in result["samples"])
    print(f"{ended} of {len(result['samples'])} end on their own")


def bench_replay(
    ctx: typer.Context,
    zoo: Optional[str] = typer.Option("code", "--zoo", help="Shipped model set (its target)."),
    target: Optional[str] = typer.Option(None, "--target", "-t", help="Target model directory (instead of the zoo's)."),
    methods: str = typer.Option(
        "autoregressive,prompt_lookup,suffix",
        "--methods",
        help="Comma list of methods (with --target, ones without a draft model), each on its own pipeline; the first "
        "is the one every text must equal.",
    ),
    prompts: str = typer.Option("humaneval", "--prompts", help="humaneval, spec_bench[:category] or a prompt file."),
    num_prompts: int = typer.Option(8, "--num-prompts", min=1, help="The first N prompts that fit the context."),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", "-n", min=1),
    passes: int = typer.Option(2, "--passes", min=1, help="Times the prompt set runs, in one process."),
    gamma: str = typer.Option("8", "--gamma", help="Draft length of every method: an integer, auto or conf."),
    backend: str = typer.Option("hf", "--backend", help="hf or llamacpp."),
    data_dir: Optional[Path] = typer.Option(
        None, "--data-dir", help="Folder holding humaneval/ (default: the shipped copy)."
    ),
    threads: Optional[int] = typer.Option(None, "--threads"),
    out: Path = typer.Option(folders.METHODS, "--out", help="Folder of NAME.json and NAME.md."),
    name: Optional[str] = typer.Option(None, "--name", help="File stem (default: replay-<prompt set>)."),
) -> None:
    """A replayed repetitive workload: the same prompts several times in one process, `suffix` (its cache warm
    from the earlier passes) against `prompt_lookup`, in tokens per target call and tokens per second; exit 1 when
    a method's text differs from the first method's."""
    from .config import ModelChoice
    from .replay import run_replay, table

    command = recorded_command(ctx)
    chosen = tuple(m.strip() for m in methods.split(",") if m.strip())
    result = run_reporting(
        lambda: run_replay(
            ModelChoice(zoo, target, data_dir=data_dir),
            methods=chosen,
            prompts=prompts,
            num_prompts=num_prompts,
            max_new_tokens=max_new_tokens,
            passes=passes,
            gamma=int(gamma) if gamma.isdigit() else gamma,
            backend=backend,
            threads=threads,
            out=out,
            name=name,
            command=command,
            echo=echo,
        )
    )
    print(table(result["rows"]))
    if result["differences"]:
        err_console.print(f"[red]texts differ:[/red] {escape('; '.join(result['differences']))}")
        raise typer.Exit(1)


def bench_serve(
    ctx: typer.Context,
    url: Optional[str] = typer.Option(
        None, "--url", help="A running server (loopback only), e.g. http://127.0.0.1:8000."
    ),
    spawn: Optional[str] = typer.Option(
        None,
        "--spawn",
        help="Start `draftverify serve` with these arguments "
        'instead (e.g. "--zoo code --max-batch 8"); its RSS is sampled.',
    ),
    model: Optional[str] = typer.Option(None, "--model", help="Model id to send (default: the server's /v1/models)."),
    pid: Optional[int] = typer.Option(None, "--pid", help="The server's process id, for RSS (automatic with --spawn)."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="DRAFTVERIFY_API_KEY", show_default=False),
    clients: int = typer.Option(8, "--clients", help="Concurrent streaming clients (1..256)."),
    requests: int = typer.Option(1000, "--requests", help="Stop after this many requests."),
    duration: float = typer.Option(300.0, "--duration", help="Stop after this many seconds."),
    max_tokens: int = typer.Option(64, "--max-tokens"),
    warmup: int = typer.Option(4, "--warmup", help="Untimed requests before measuring (and RSS before)."),
    rss_every: int = typer.Option(100, "--rss-every", help="Sample the server's RSS every N completed requests."),
    rss_warm: int = typer.Option(
        200, "--rss-warm", help="Growth after warm-up: the last RSS sample minus the first at or after N requests."
    ),
    mixed: bool = typer.Option(
        False,
        "--mixed",
        help="Alternate greedy and seeded sampling requests (one batch "
        "holds both) and check every answer against the same request sent alone first.",
    ),
    out: Optional[Path] = typer.Option(
        None,
        "--out",
        help=f"Write the report JSON here (e.g. {folders.SERVING}/"
        "load-test.json) and a markdown report (.md) beside it.",
    ),
) -> None:
    """Bounded loopback load test of `draftverify serve`: throughput, latency and time to first token, errors and
    the server's resident memory over the run; exit 1 when a request failed or (--mixed) an answer differed from
    its request sent alone."""
    import json

    from .load_test import run_load_test

    command = recorded_command(ctx, always=())
    report = exit_2_on_error(
        lambda: run_load_test(
            url,
            spawn,
            model,
            pid,
            api_key,
            clients,
            requests,
            duration,
            max_tokens,
            warmup,
            rss_every,
            rss_warm,
            mixed,
            out,
            command,
        )
    )
    print(json.dumps(report, indent=1))
    if not report["passed"]:
        raise typer.Exit(1)


def bench_serve_llamacpp(
    ctx: typer.Context,
    zoo: Optional[str] = typer.Option(
        "code", "--zoo", help="The shipped model set whose target (and draft) both serve."
    ),
    target: Optional[str] = typer.Option(None, "--target", help="A target folder or .gguf file instead of the zoo's."),
    draft: Optional[str] = typer.Option(None, "--draft", help="A draft folder or .gguf file instead of the zoo's."),
    methods: str = typer.Option(
        "autoregressive,model",
        "--methods",
        help="Comma list of our methods, one server each (--backend llamacpp); METHOD[GAMMA] gives one its own draft "
        "length, e.g. model[16].",
    ),
    native: Optional[List[str]] = typer.Option(
        None,
        "--native",
        help="A llama-server row, repeatable: plain (default) or its --spec-type list with settings, e.g. "
        "'ngram-mod' or 'draft-simple,n_max=16,p_min=0.75'.",
    ),
    clients: str = typer.Option("1,4,8", "--clients", help="Comma list of concurrent streaming clients."),
    max_tokens: str = typer.Option("32,256", "--max-tokens", help="Comma list of answer lengths (short, long)."),
    per_client: int = typer.Option(3, "--per-client", help="Requests per client in each cell."),
    rounds: int = typer.Option(
        1,
        "--rounds",
        help="Loads per server in each cell, the servers taking turns (order rotated each round); a cell reports "
        "the round with the median throughput.",
    ),
    gamma: str = typer.Option("conf=0.9", "--gamma", help="Our servers' draft length (as serve --gamma)."),
    threads: int = typer.Option(2, "--threads", help="CPU threads of every server."),
    target_gguf: str = typer.Option(
        "f32", "--target-gguf", help=f"The target's GGUF type: {', '.join(DRAFT_GGUF_TYPES)}."
    ),
    draft_gguf: str = typer.Option("q8_0", "--draft-gguf", help="The draft's GGUF type."),
    duration: float = typer.Option(600.0, "--duration", help="Longest seconds one cell's load may run."),
    out: Optional[Path] = typer.Option(
        None, "--out", help=f"Write the report JSON here (e.g. {folders.SERVING}/llamacpp.json) and a .md beside it."
    ),
) -> None:
    """Our server on the llama.cpp backend against llama.cpp's own llama-server on the same GGUF files: 1 / 4 / 8
    clients, short and long answers; throughput, p50 / p99 latency, every answer against the same request alone."""
    import json

    from .serve_llamacpp import run_comparison

    command = recorded_command(ctx, always=())
    report = exit_2_on_error(
        lambda: run_comparison(
            zoo if target is None else None,
            target,
            draft,
            methods,
            native or [],
            clients,
            max_tokens,
            per_client,
            gamma,
            threads,
            target_gguf,
            draft_gguf,
            duration,
            out,
            command,
            echo,
            rounds,
        )
    )
    print(json.dumps(report["versus"], indent=1))
    if out is not None:
        print(f"wrote {out}")
    failed = [c for c in report["cells"] if c["ok"] != c["requests"]]
    if failed:
        raise typer.Exit(1)


# suite -> its command, in the order `draftverify bench --help` lists them
SUITES: dict[str, Callable[..., Any]] = {
    "speed": speed,
    "batch": bench_batch,
    "serve": bench_serve,
    "serve-llamacpp": bench_serve_llamacpp,
    "overhead": bench_overhead,
    "cold-start": bench_cold_start,
    "ab": bench_ab,
    "rounds": bench_rounds,
    "native": bench_native,
    "synthetic": bench_synthetic,
    "replay": bench_replay,
    "samples": bench_samples,
}
bench_app = typer.Typer(
    help="The benchmark suites a user reruns against peers: speed (the main bench), batch, serve, serve-llamacpp, "
    "overhead, cold-start, ab, rounds, native, synthetic, replay, samples.",
    no_args_is_help=True,
)
for _name, _command in SUITES.items():
    bench_app.command(_name)(_command)

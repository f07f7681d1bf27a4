"""The `draftverify bench-ab` command (bench/ab.py runs it); kept apart from cli.py, which registers it."""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.markup import escape

from ..errors import DraftVerifyError
from . import folders


def bench_ab(
    vary: List[str] = typer.Option(..., "--vary", help="NAME=V1,V2,...: a public option and the values to compare "
                                   "(repeat for several; the settings are every combination, the first is the "
                                   "reference). NAME: method, draft, gamma, dtype, backend, draft_gguf or a declared "
                                   "method option (e.g. lookup_confirms=false,true; lookup_tokens=0,5)."),
    set_: List[str] = typer.Option([], "--set", help="NAME=VALUE: an option every setting shares (repeatable), as "
                                   "--vary names them, e.g. --set backend=llamacpp --set gamma=conf."),
    zoo: str = typer.Option("code", "--zoo", help="Shipped model set (its target; its draft for methods that "
                            "take one)."),
    target: Optional[str] = typer.Option(None, "--target", "-t", help="Target model directory (instead of the zoo's)."),
    prompts: str = typer.Option("humaneval", "--prompts", help="humaneval, spec_bench or spec_bench:<category>."),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="Folder holding the prompt sets (default: "
                                            "the shipped copies)."),
    first: int = typer.Option(0, "--first", help="First prompt: a choice made on the bench's prompts (0-7) can "
                              "be checked on others, e.g. --first 100."),
    num_prompts: int = typer.Option(8, "--num-prompts"),
    rounds: int = typer.Option(3, "--rounds", help="Rounds over the prompts; ratios are medians over rounds."),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", "-n"),
    warmup_tokens: int = typer.Option(32, "--warmup-tokens", help="Tokens of one warm-up generation per setting "
                                      "(0: none)."),
    threads: Optional[int] = typer.Option(None, "--threads", help="CPU threads for torch (and llama.cpp)."),
    check_text: bool = typer.Option(True, "--check-text/--no-check-text", help="Stop when the settings give "
                                    "different texts (lossless settings must not); off for settings that change "
                                    "the output (dtype, backend)."),
    out: Path = typer.Option(folders.DRAFT_POLICY, "--out", help="Folder of NAME.json and NAME.md."),
    name: str = typer.Option("ab", "--name", help="File stem."),
) -> None:
    """Settings of one method side by side in one process: each a pipeline of its own, every setting on every
    prompt, the order rotated prompt by prompt; tok/s, its ratio to the first setting, tokens per call."""
    from .ab import ABConfig, parse_assignments, run_ab

    err = Console(stderr=True, soft_wrap=True)
    command = ["draftverify", "bench-ab"] + [a for v in vary for a in ("--vary", v)]
    command += [a for v in set_ for a in ("--set", v)] + (["--target", target] if target else ["--zoo", zoo])
    command += ["--prompts", prompts, "--first", str(first), "--num-prompts", str(num_prompts), "--rounds",
                str(rounds), "-n", str(max_new_tokens), "--warmup-tokens", str(warmup_tokens)]
    command += (["--threads", str(threads)] if threads else []) + ([] if check_text else ["--no-check-text"])
    command += ["--out", str(out), "--name", name]
    try:
        fixed = {k: v[0] for k, v in parse_assignments(set_, many=False).items()}
        cfg = ABConfig(vary=parse_assignments(vary, many=True), fixed=fixed, zoo=zoo, target=target, prompts=prompts,
                       data_dir=data_dir, first=first, num_prompts=num_prompts, rounds=rounds,
                       max_new_tokens=max_new_tokens, warmup_tokens=warmup_tokens, threads=threads,
                       check_text=check_text, out=out, name=name, command=shlex.join(command))
        result = run_ab(cfg, echo=lambda line: err.print(f"[dim]{escape(line)}[/dim]"))
    except DraftVerifyError as error:
        err.print(f"[red]error:[/red] {escape(str(error))}")
        raise typer.Exit(2) from None
    print(open(result["files"]["markdown"]).read())
    print(f"wrote {result['files']['json']} and {result['files']['markdown']}")

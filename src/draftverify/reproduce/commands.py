"""The `draftverify reproduce` group: one command per seed paper, each rerunning that paper's tables and ablations
on our models and naming the tables it reproduces (leviathan: the closed-form tables; specdec: SpecDec / SpecDec++
and BiLD's sweeps on translation; blockwise; bita; healing, the one study with no seed paper behind it). Typer
functions only, each running its module of reproduce/; cli.py adds reproduce_app. Nothing heavy is imported here,
so --help stays fast."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from ..bench import folders
from ..checks import check_max_new_tokens
from ..cli_help import flag
from ..errors import DraftVerifyError
from ..quiet import quiet_process

console = Console()
err_console = Console(stderr=True, soft_wrap=True)
reproduce_app = typer.Typer(
    help="The seed papers' tables and ablations on our models, one command per paper: leviathan (speculative "
    "decoding's closed forms), specdec (SpecDec, SpecDec++ and BiLD on translation), blockwise (blockwise parallel "
    "decoding with rescoring), bita, healing.",
    no_args_is_help=True,
)


@reproduce_app.command("leviathan")
def leviathan() -> None:
    """Leviathan et al.'s Table 1 (operations and speed against alpha and gamma) and the EXP column of Table 4
    (Theorem 8 at the printed alpha, gamma, c), computed by draftverify.theory beside the printed values; no model
    runs (`bench speed` measures alpha and speed on our models, Theorem 8 beside each row)."""
    from .leviathan import report

    print(report())


@reproduce_app.command("specdec")
def specdec(
    zoo: str = flag("translate", "--zoo", help="Zoo entry with an encoder-decoder target (and draft, nat)."),
    draft: Optional[Path] = flag(
        None,
        "--draft",
        help="Small model of the hf_assisted, model and bild rows (default: the zoo's draft, if it has one).",
    ),
    aligned_draft: Optional[Path] = flag(
        None,
        "--aligned-draft",
        help="Aligned small model (BiLD prediction alignment) for the model_aligned and "
        "bild_aligned rows (default: the zoo's draft-aligned, if it has one).",
    ),
    data_dir: Path = flag(Path("../shared/data"), "--data-dir", help="Folder holding multi30k_en_de/."),
    split: str = flag("test_2016_flickr", "--split", help="Multi30k split whose sources are translated."),
    num_prompts: int = flag(100, "--num-prompts", help="The first N sentences."),
    max_new_tokens: int = flag(64, "--max-new-tokens", "-n"),
    ks: str = flag("2,4,6,8", "--ks", help="SpecDec block sizes k (comma list)."),
    betas: str = flag("3,5", "--betas", help="SpecDec++ top-beta values."),
    taus: str = flag("1,3,6", "--taus", help="SpecDec++ tolerances tau."),
    plus_k: int = flag(8, "--plus-k", help="Block size of the SpecDec++ rows."),
    gammas: str = flag("3", "--gammas", help="Draft lengths of the small model's rows (model, hf_assisted)."),
    bild_fb: str = flag("0.2,0.4,0.6,0.8", "--bild-fb", help="BiLD fallback thresholds."),
    bild_rb: str = flag("1,2,3,5", "--bild-rb", help="BiLD rollback thresholds."),
    bild_gamma: int = flag(10, "--bild-gamma", help="Longest BiLD draft."),
    beams: int = flag(5, "--beams", help="Beam size of the AT beam baseline."),
    threads: Optional[int] = flag(None, "--threads", help="CPU threads for torch."),
    out: Path = flag(folders.TRANSLATION, "--out", help="Writes <name>.json, <name>.md, <name>-bild.png."),
    name: str = flag("translate-multi30k", "--name"),
    counts_only: bool = flag(
        False,
        "--counts-only",
        help="No timings (a busy machine): BLEU, tokens per "
        "target call, large- and small-model calls; the BiLD plot against calls.",
    ),
) -> None:
    """SpecDec's Tables 2 (k sweep) and 18 (where the time goes), SpecDec++'s beta x tau grid (Table 3) and BiLD's
    threshold sweep (Figure 4, Table 1) on one translation pair, against AT greedy / beam / HF assisted: BLEU, speed."""
    import shlex

    from ..bench import environment
    from ..bench.prompts import load_multi30k
    from .translation import _grid, run_sweep, write

    try:
        grid = dict(
            ks=_grid(ks, int),
            betas=_grid(betas, int),
            taus=_grid(taus, float),
            plus_k=plus_k,
            gammas=_grid(gammas, int),
            fbs=_grid(bild_fb, float),
            rbs=_grid(bild_rb, float),
            bild_gamma=bild_gamma,
            beams=beams,
        )
        if num_prompts < 1:
            raise DraftVerifyError(f"--num-prompts must be >= 1, got {num_prompts}")
        prompts = load_multi30k(data_dir, split)[:num_prompts]
        quiet_process()
        import torch

        from ..api import load_model, load_tokenizer, zoo_paths
        from ..options import fill_from_zoo
        from ..zoo import zoo_folder

        if threads is not None:
            torch.set_num_threads(threads)
        paths = zoo_paths(zoo)
        target = load_model(paths["target"])
        if not getattr(target.config, "is_encoder_decoder", False):
            raise DraftVerifyError(f"reproduce specdec needs an encoder-decoder target; zoo {zoo!r}'s is decoder-only")
        small = {}
        for role, option, explicit, default in (
            ("draft", "--draft", draft, paths["draft"]),
            ("aligned draft", "--aligned-draft", aligned_draft, paths["draft_aligned"]),
        ):
            if explicit is not None and not explicit.exists():
                raise DraftVerifyError(f"{option} {explicit}: no such directory (an exported small translation model)")
            path = explicit or (default if default.exists() else None)
            small[role] = load_model(path, role=role) if path is not None else None
        nat = fill_from_zoo({}, zoo_folder(zoo)).get("nat_path")
        result = run_sweep(
            target,
            small["draft"],
            nat,
            load_tokenizer(paths["target"]),
            prompts,
            max_new_tokens,
            log=lambda m: err_console.print(f"[dim]{m}[/dim]"),
            aligned_model=small["aligned draft"],
            counts_only=counts_only,
            **grid,
        )
    except DraftVerifyError as err:
        err_console.print(f"[red]error:[/red] {escape(str(err))}")
        raise typer.Exit(2) from None
    result.update(
        name=name,
        command=shlex.join(["draftverify", *sys.argv[1:]]),
        prompts=f"multi30k:{split}",
        threads=torch.get_num_threads(),
        date=environment.now(),
        machine="{cpu_model}, load average {load_average[0]:.1f} at the end".format(**environment.machine()),
    )
    files = write(result, out, name)
    console.print(f"wrote {', '.join(files.values())}")


@reproduce_app.command("blockwise")
def blockwise(
    zoo: str = flag("code", "--zoo", help="Zoo entry whose target, heads, n-gram table and tokenizer are used."),
    heads: Optional[Path] = flag(None, "--heads", help="Heads folder (default: the zoo's heads)."),
    prompts: int = flag(16, "--prompts", help="HumanEval prompts (the first N)."),
    tune: int = flag(4, "--tune", help="Prompts, of those, used to tune the n-gram weight alpha."),
    new_tokens: int = flag(64, "--new-tokens"),
    lattice_k: int = flag(4, "--lattice-k", help="Candidates per head for rescoring and p-best."),
    out: str = flag(str(folders.METHODS / "bpd-humaneval"), "--out", help="Writes OUT.json and OUT.md."),
    threads: Optional[int] = flag(None, "--threads"),
) -> None:
    """Blockwise parallel decoding's drafts (Kim et al.) on the zoo: block efficiency of bpd, oracle top-k, n-gram and
    neural rescoring, p-best (Table 4, Figures 6 and 7); repetition in drafts before/after rescoring (Table 3);
    per-head entropy (Figure 3); neural vs plain wins/ties/losses (Table 5); counts only."""
    import shlex

    from ..api import zoo_paths
    from ..options import zoo_files
    from ..zoo import zoo_folder
    from .blockwise import main as report_main

    if prompts < 2:
        err_console.print(
            f"[red]error:[/red] --prompts must be >= 2 (some tune the weights, the rest are reported), got {prompts}"
        )
        raise typer.Exit(2)
    if not 0 < tune < prompts:
        err_console.print(
            f"[red]error:[/red] --tune must be in 1..{prompts - 1} (some prompts must stay for the report)"
        )
        raise typer.Exit(2)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    try:
        paths, files = zoo_paths(zoo), zoo_files(zoo_folder(zoo))
        result = report_main(
            str(paths["target"]),
            str(heads or files["heads_path"]),
            str(files["ngram_path"]),
            str(paths["draft"]),
            str(paths["target"]),
            prompts,
            tune,
            new_tokens,
            lattice_k,
            out,
            shlex.join(["draftverify", *sys.argv[1:]]),
        )
    except DraftVerifyError as err:
        err_console.print(f"[red]error:[/red] {err}")
        raise typer.Exit(2) from None
    console.print(
        json.dumps(
            {
                "block_efficiency": result["block_efficiency"],
                "tuned_alpha": result["tuned_alpha"],
                "tuned_neural_alpha": result["tuned_neural_alpha"],
                "neural_vs_plain": result["neural_vs_plain"],
                "repetition": result["repetition"],
                "h_max": result["h_max"],
            },
            indent=1,
        )
    )
    console.print(f"wrote {out}.json and {out}.md")


@reproduce_app.command("bita")
def bita(
    zoo: str = flag("code", "--zoo", help="Zoo entry whose target (and default adapter) are used."),
    bita: Optional[list[Path]] = flag(
        None,
        "--bita",
        help="Adapter folder(s); the first drives the mode and mask tables and is the reference the prompts, "
        "prompt-count and mask-count tables compare the others with (same M and P / kind and M / kind and P) (default: "
        "the zoo's).",
    ),
    prompts: int = flag(8, "--prompts", help="HumanEval prompts (the first N)."),
    new_tokens: int = flag(64, "--new-tokens"),
    topk: int = flag(3, "--topk", help="Efficient-tree candidates per mask token for the prompt and mask tables."),
    tables: str = flag(
        "modes,prompts,masks",
        "--tables",
        help="Comma list of the tables to run: modes, prompts, prompt-count, mask-count, masks.",
    ),
    cost: Optional[Path] = flag(
        None, "--cost", help="A cost-curve JSON (draftverify bench speed --cost-curve) for estimated speedups."
    ),
    out: str = flag(str(folders.METHODS / "bita-humaneval"), "--out", help="Writes OUT.json and OUT.md."),
    threads: Optional[int] = flag(None, "--threads"),
) -> None:
    """BiTA's ablations on the zoo: decoding modes (Table 4), prompt designs (Table 3), numbers of prompt and mask
    tokens (Figures 8 and 9): tokens per target call, verify width, greedy equality; counts only, no timing claims."""
    import shlex

    from ..api import zoo_paths
    from ..options import zoo_files
    from ..zoo import zoo_folder
    from .bita import TABLES, main as report_main

    chosen = tuple(t.strip() for t in tables.split(",") if t.strip())
    if not chosen or any(t not in TABLES for t in chosen):
        err_console.print(f"[red]error:[/red] --tables takes a comma list of {', '.join(TABLES)}, got {tables!r}")
        raise typer.Exit(2)
    if prompts < 1 or new_tokens < 1 or topk < 1:
        err_console.print("[red]error:[/red] --prompts, --new-tokens and --topk must be >= 1")
        raise typer.Exit(2)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    try:
        paths = zoo_paths(zoo)
        adapters = [str(p) for p in bita] if bita else [str(zoo_files(zoo_folder(zoo))["bita_path"])]
        result = report_main(
            str(paths["target"]),
            adapters,
            prompts,
            new_tokens,
            topk,
            out,
            shlex.join(["draftverify", *sys.argv[1:]]),
            str(cost) if cost else None,
            log=lambda m: err_console.print(escape(m)),
            tables=chosen,
        )
    except DraftVerifyError as err:
        err_console.print(f"[red]error:[/red] {err}")
        raise typer.Exit(2) from None
    console.print(json.dumps({r["config"]: round(r["tokens_per_call"], 3) for r in result["rows"]}))


@reproduce_app.command("healing")
def healing(
    zoo: Optional[str] = flag("code", "--zoo", help="Shipped model set (its target; its draft for --methods)."),
    target: Optional[str] = flag(None, "--target", "-t", help="Target model directory (instead of the zoo's)."),
    draft: Optional[str] = flag(None, "--draft", "-d", help="Draft model for --methods that need one."),
    methods_: str = flag(
        "lookup_model",
        "--methods",
        help="Comma list of our methods that also run the published prompts, healing off and on, compared token for "
        "token with autoregressive ('' for none).",
    ),
    num_prompts: int = flag(8, "--num-prompts", help="The first N HumanEval prompts that fit the context."),
    max_new_tokens: int = flag(128, "--max-new-tokens", "-n"),
    data_dir: Optional[Path] = flag(None, "--data-dir", help="Folder holding humaneval/ (default: the shipped copy)."),
    threads: Optional[int] = flag(None, "--threads"),
    out: Path = flag(folders.METHODS, "--out"),
    name: str = flag("healing-humaneval", "--name", help="Writes OUT/NAME.json and OUT/NAME.md."),
) -> None:
    """Token healing on HumanEval (no seed paper's table: the prompt-boundary study behind generate's --heal): chrF
    against the canonical solutions for prompts trimmed of their final newline and as published (ending in a
    newline), healing off and on (greedy). `draftverify bench speed --prompts humaneval:published` runs the full
    bench on the published prompts."""
    import shlex

    # the command as parsed (not sys.argv, which is the caller's when invoked in-process)
    command = ["draftverify", "reproduce", "healing"] + (["--target", target] if target else ["--zoo", str(zoo)])
    command += (["--draft", draft] if draft else []) + [
        "--methods",
        methods_,
        "--num-prompts",
        str(num_prompts),
        "--max-new-tokens",
        str(max_new_tokens),
    ]
    command += (["--data-dir", str(data_dir)] if data_dir else []) + (["--threads", str(threads)] if threads else [])
    command += ["--out", str(out), "--name", name]
    try:
        from .healing import run_healing

        check_max_new_tokens(max_new_tokens)
        quiet_process()
        result = run_healing(
            zoo=None if target else zoo,
            target=target,
            draft=draft,
            methods=tuple(m.strip() for m in methods_.split(",") if m.strip()),
            num_prompts=num_prompts,
            max_new_tokens=max_new_tokens,
            data_dir=data_dir,
            threads=threads,
            out=out,
            name=name,
            command=shlex.join(command),
            echo=lambda line: err_console.print(f"[dim]{escape(line)}[/dim]"),
        )
    except DraftVerifyError as err:
        err_console.print(f"[red]error:[/red] {escape(str(err))}")
        raise typer.Exit(2) from None
    from .healing import table

    print(table(result["rows"]))  # plain: a markdown table, never wrapped or read as markup
    print(f"wrote {result['files']['json']} and {result['files']['markdown']}")

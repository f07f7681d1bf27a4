"""What `draftverify bench speed` does with its options: parse the lists, run, print a summary table and the files."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..errors import DraftVerifyError
from ..options import all_fields, defaults, parse_values
from ..options.declare import declaration
from .config import BenchConfig, parse_floats, parse_gammas, parse_ints, parse_names, parse_runners
from .cost import MODES
from .folders import COST, SPEED
from .report import overshoot_text

console = Console(soft_wrap=True)  # notes and paths printed whole, not broken at 80 columns when piped
err_console = Console(stderr=True, soft_wrap=True)


def config_from_options(
    *,
    temperature: str | None,
    gamma: str | None,
    early_exit_layers: str | None,
    bild_fb: str | None,
    bild_rb: str | None,
    runners: str | None,
    backend: str = "hf",
    **options,
) -> BenchConfig:
    """Strings from the command line -> BenchConfig (comma lists parsed here; values validated by resolved())."""
    return BenchConfig(
        backends=parse_names("--backend", backend),
        temperatures=parse_floats("--temperature", temperature) if temperature is not None else None,
        gammas=parse_gammas(gamma) if gamma is not None else None,
        early_exit_layers=parse_ints("--early-exit-layers", early_exit_layers) if early_exit_layers else None,
        bild_fb=parse_floats("--bild-fb", bild_fb) if bild_fb is not None else None,
        bild_rb=parse_floats("--bild-rb", bild_rb) if bild_rb is not None else None,
        runners=parse_runners(runners) if runners is not None else None,
        **options,
    )


def summary_table(rows: list[dict]) -> Table:
    table = Table(title="bench summary (speedup: tokens/s over hf_generate, same temperature)", header_style="bold")
    table.add_column("runner", no_wrap=True, min_width=max((len(r["runner"]) for r in rows), default=6))
    for column in ("T", "tok/s", "speedup", "tokens/call", "alpha", "= baseline", "overshoot"):
        table.add_column(column, justify="right")
    for r in rows:
        eq = r["equal_to_baseline"]
        eq_text = "-" if eq is None else f"{100 * eq:.0f}%"
        if eq is not None and eq < 1 and r["lossless"]:
            eq_text = f"[bold red]{eq_text}[/bold red]"
        # escaped (as every printed note): rich reads `hf_assisted[g=2]` as a style tag and prints `hf_assisted`
        table.add_row(
            escape(r["runner"]),
            f"{r['temperature']:g}",
            f"{r['tokens_per_second'] or 0:.1f}",
            f"{r['speedup']:.2f}x" if r.get("speedup") else "-",
            f"{r['tokens_per_call']:.2f}" if r["tokens_per_call"] else "-",
            f"{r['alpha']:.3f}" if r["alpha"] is not None else "-",
            eq_text,
            overshoot_text(r),
        )
    return table


def given_flags(method_options: dict) -> dict[str, object]:
    """The declared options given a value other than their default, by flag: {"--nat": "zoo/x/nat"}."""
    fields, default = all_fields(), defaults()
    return {
        declaration(fields[name][1]).flag: value
        for name, value in method_options.items()
        if value is not None and value != default.get(name)
    }


def rebuild_command(options: dict, method_options: dict | None = None) -> str:
    """`draftverify bench speed ...` from parsed options, for when sys.argv is not ours (e.g. called in-process)."""
    argv = ["draftverify", "bench", "speed"]
    for flag, value in given_flags(method_options or {}).items():
        argv += [flag, str(value)]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is None or (key == "backend" and value == "hf"):
            continue
        if isinstance(value, bool):
            if key in ("plots", "progress", "flash_attn") and not value:
                argv.append("--no-" + key.replace("_", "-"))
            elif value and key not in ("plots", "progress"):
                argv.append(flag)
            continue
        argv += [flag, str(value)]
    return shlex.join(argv)


# bench options the cost curve does not use: passing one with --cost-curve is a mistake, said so
COST_IGNORES = (
    "backend",
    "temperature",
    "draft",
    "aligned_draft",
    "gamma",
    "early_exit_layers",
    "bild_fb",
    "bild_rb",
    "runners",
    "dtype",
    "draft_gguf",
    "target_gguf",
    "flash_attn",
    "compile",
)  # and every declared drafter option (given_flags)


def cost_config_from_options(options: dict, command: str, method_options: dict | None = None):
    """The bench's options -> CostConfig: --num-prompts / --max-new-tokens size the greedy equality check."""
    from .cost_run import CostConfig

    plain = {"dtype": "auto", "compile": False, "backend": "hf"}
    given = [
        "--" + k.replace("_", "-")
        for k in COST_IGNORES
        if options.get(k) is not None and options.get(k) != plain.get(k)
    ]
    given += list(given_flags(method_options or {}))
    if given:
        raise DraftVerifyError("--cost-curve does not use " + ", ".join(given))
    return CostConfig(
        zoo=options["zoo"],
        target=options["target"],
        prompts=options["prompts"],
        data_dir=options["data_dir"],
        sizes=parse_ints("--cost-sizes", options["cost_sizes"]) if options["cost_sizes"] is not None else None,
        modes=parse_names("--cost-modes", options["cost_modes"]) if options["cost_modes"] is not None else MODES,
        repeats=options["cost_repeats"],
        equality_prompts=options["num_prompts"],
        equality_tokens=options["max_new_tokens"],
        threads=options["threads"],
        device=options["device"],
        out=options["out"],
        name=options["name"],
        quick=options["quick"],
        plots=options["plots"],
        command=command,
    )


def run_cost_curve(options: dict, command: str, method_options: dict | None = None) -> int:
    from .cost_run import run_cost

    try:
        result = run_cost(
            cost_config_from_options(options, command, method_options),
            progress=(lambda text: err_console.print(escape(text))) if options["progress"] else None,
        )
    except DraftVerifyError as err:
        err_console.print(f"[red]error:[/red] {escape(str(err))}")
        return 2
    for name, entry in result["modes"].items():
        ms = ", ".join(f"n={p['n']}: {p['median_ms']:.2f}" for p in entry["points"])
        eq = entry["equality"]
        console.print(f"{name}: {ms} ms" + ("" if eq is None else f"; greedy equal {100 * eq['equal_rate']:.0f}%"))
    for kind, path in result["files"].items():
        console.print(f"wrote {kind}: {escape(path)}")
    return 0


def main(method_options: dict | None = None, **options) -> int:
    """Run the benchmark (or, with cost_curve, the cost curve) from command-line strings; returns the process exit
    code (2 for bad input). method_options: the declared drafter options' flags, by field name."""
    from .run import run_bench

    method_options = method_options or {}
    ours = Path(sys.argv[0]).name in ("draftverify", "cli.py") and sys.argv[1:3] == ["bench", "speed"]
    command = shlex.join(sys.argv) if ours else rebuild_command(options, method_options)
    cost = {k: options.pop(k) for k in ("cost_curve", "cost_sizes", "cost_modes", "cost_repeats")}
    if options.get("out") is None:
        options["out"] = COST if cost["cost_curve"] else SPEED
    if cost["cost_curve"]:
        return run_cost_curve({**options, **cost}, command, method_options)
    unused = [f"--{k.replace('_', '-')}" for k, v in cost.items() if v is not None and k != "cost_curve"]
    try:
        if unused:
            raise DraftVerifyError(f"{', '.join(unused)} only apply with --cost-curve")
        result = run_bench(config_from_options(**options, options=parse_values(method_options), command=command))
    except DraftVerifyError as err:
        err_console.print(f"[red]error:[/red] {escape(str(err))}")
        return 2
    if not console.is_terminal:  # piped or redirected, rich would squeeze the table into 80 columns, figures cut
        console.width = max(console.width, 200)
    console.print(summary_table(result["runners"]))
    for note in result["notes"]:
        console.print(f"note: {escape(note)}")
    for kind, path in result["files"].items():
        console.print(f"wrote {kind}: {escape(path)}")
    for warning in result["warnings"]:
        err_console.print(f"[bold red]WARNING: {escape(warning)}[/bold red]")
    return 0

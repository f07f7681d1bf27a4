"""The options the side-by-side scripts share: --prompts and --rounds, each a whole number of at least 1 (a wrong
value is argparse's one-line error and exit 2)."""
from __future__ import annotations

import argparse
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def at_least(minimum: int):
    """An argparse type: a whole number of at least `minimum` (argparse's one-line error and exit 2 otherwise)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


at_least_one = at_least(1)


def ab_parser(rounds: int | None = 3, prompts: int = 8, first: bool = False) -> argparse.ArgumentParser:
    """A parser with --prompts (HumanEval prompts, default `prompts`), unless rounds is None --rounds, and with
    first --first (the first HumanEval prompt, so a choice can be checked on prompts the bench, 0-7, never uses)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=at_least_one, default=prompts)
    if rounds is not None:
        ap.add_argument("--rounds", type=at_least_one, default=rounds)
    if first:
        ap.add_argument("--first", type=at_least(0), default=0)
    return ap


def humaneval_texts(ap: argparse.ArgumentParser, args) -> list[str]:
    """HumanEval prompts args.first (0 without --first) onwards, args.prompts of them; exit 2 when there are none."""
    from draftverify.bench.prompts import default_data_dir, load_humaneval

    first = getattr(args, "first", 0)
    texts = [p.text for p in load_humaneval(default_data_dir())[first : first + args.prompts]]
    if not texts:
        ap.exit(2, f"error: HumanEval has no prompt {first}\n")
    return texts


def round_cells(rounds: list[dict], setting, reference) -> str:
    """Table cells for `setting` over rounds (each round: setting -> [new tokens, target calls, seconds]): its median
    tok/s, the median of its tok/s over the reference setting's with the range over rounds, its tokens per call."""
    import statistics

    speeds = [r[setting][0] / r[setting][2] for r in rounds]
    ratios = [speed / (r[reference][0] / r[reference][2]) for speed, r in zip(speeds, rounds)]
    per_call = sum(r[setting][0] for r in rounds) / sum(r[setting][1] for r in rounds)
    return (f"{statistics.median(speeds):.1f} | {statistics.median(ratios):.3f}x ({min(ratios):.3f}-{max(ratios):.3f}) "
            f"| {per_call:.2f}")


def alternating_rounds(generate, settings: list, prompts: list[str], rounds: int, first: int = 0,
                       label: str = "settings") -> list[dict]:
    """Every setting on every prompt, `rounds` times, the settings' order rotated prompt by prompt and round by
    round; generate(setting, text) returns a GenerationResult. Stops (exit 1) when the settings give different texts
    on a prompt. Per round: setting -> [new tokens, target calls, seconds] (what round_cells reads)."""
    out = []
    for r in range(rounds):
        totals = {s: [0, 0, 0.0] for s in settings}
        for i, text in enumerate(prompts):
            shift = (i + r) % len(settings)
            texts = set()
            for s in settings[shift:] + settings[:shift]:
                result = generate(s, text)
                stats = result.output.stats
                texts.add(result.text)
                totals[s][0] += stats.new_tokens
                totals[s][1] += stats.target_calls
                totals[s][2] += stats.time_total
            if len(texts) != 1:
                raise SystemExit(f"prompt {first + i}: the {label} gave different texts")
        out.append(totals)
    return out


def write_report(name: str, text: str) -> None:
    """Write a script's markdown report to benchmarks/<name> and print it."""
    (BENCHMARKS / name).write_text(text)
    print(text)


def run_line(script: str, args) -> str:
    """How a side-by-side run was made: its command (with --first when not 0), the date, the CPU and its cores."""
    from draftverify.bench.environment import machine, now

    m = machine()
    first = getattr(args, "first", 0)
    rounds = getattr(args, "rounds", None)
    command = f"python scripts/{script} --prompts {args.prompts}" + (f" --rounds {rounds}" if rounds else "") + (
        f" --first {first}" if first else "")
    return f"`{command}`; {now()}; {m['cpu_model']} ({m['cores']} cores)"


def report_name(stem: str, args) -> str:
    """benchmarks/<stem>.md for the bench's prompts, <stem>-from-N.md for a run from HumanEval prompt N."""
    first = getattr(args, "first", 0)
    return f"{stem}.md" if not first else f"{stem}-from-{first}.md"


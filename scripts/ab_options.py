"""The options the side-by-side scripts share: --prompts and --rounds, each a whole number of at least 1 (a wrong
value is argparse's one-line error and exit 2)."""
from __future__ import annotations

import argparse
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def ab_parser(rounds: int | None = 3, prompts: int = 8) -> argparse.ArgumentParser:
    """A parser with --prompts (HumanEval prompts, default `prompts`) and, unless rounds is None, --rounds."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=at_least_one, default=prompts)
    if rounds is not None:
        ap.add_argument("--rounds", type=at_least_one, default=rounds)
    return ap


def write_report(name: str, text: str) -> None:
    """Write a script's markdown report to benchmarks/<name> and print it."""
    (BENCHMARKS / name).write_text(text)
    print(text)

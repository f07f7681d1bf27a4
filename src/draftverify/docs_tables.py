"""The measured tables of README.md and docs/, copied from the benchmark files that hold them.

A page marks each table with `<!-- name:begin -->` / `<!-- name:end -->`; `draftverify docs tables` replaces what
lies between with the table from the file `TABLES` names for it, followed by a line naming that file, so every
figure in the docs is one a benchmark command printed. `TABLES` is the one place that says which table comes from
where. No torch import: it runs as fast as `--help`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .errors import DraftVerifyError


@dataclass(frozen=True)
class TableSource:
    """One marked table: the page holding it, its marker, the benchmark file and where in it the table starts."""

    page: str  # README.md or docs/<page>.md, relative to the repository root
    marker: str  # the name in <!-- name:begin --> / <!-- name:end -->
    source: str  # the benchmark markdown file, relative to the repository root
    after: str | None = None  # the first table after this text is copied; None: the file's first table


GREEDY = "## Temperature 0 (greedy)"  # where a bench speed file's greedy table starts
# page -> its marked tables: (marker, benchmark file) or (marker, benchmark file, the text the table follows)
_PAGES: dict[str, tuple[tuple[str, ...], ...]] = {
    "README.md": (
        ("native-best", "benchmarks/speed/bench-native.md"),
        ("bench-llamacpp-duels", "benchmarks/speed/bench-humaneval-llamacpp.md", "## Head to head"),
    ),
    "docs/benchmarks-llamacpp.md": (
        ("native-best", "benchmarks/speed/bench-native.md"),
        ("native-exact", "benchmarks/speed/bench-native-exact.md"),
        ("synthetic", "benchmarks/speed/bench-synthetic.md"),
        ("native-duels", "benchmarks/speed/bench-humaneval-llamacpp-native.md", GREEDY),
        ("native-duels-q8", "benchmarks/speed/bench-humaneval-llamacpp-native-q8_0.md", GREEDY),
        ("q8-invariant", "benchmarks/speed/bench-humaneval-llamacpp-q8_0-invariant.md", GREEDY),
        ("native-rounds", "benchmarks/speed/rounds-humaneval-llamacpp-native.md"),
        ("model-free", "benchmarks/speed/bench-humaneval-llamacpp-model-free.md", GREEDY),
        ("model-free-q8", "benchmarks/speed/bench-humaneval-llamacpp-model-free-q8_0.md", GREEDY),
        ("llamacpp-eagle3", "benchmarks/speed/bench-humaneval-llamacpp-eagle3.md", GREEDY),
        ("bench-llamacpp", "benchmarks/speed/bench-humaneval-llamacpp.md", GREEDY),
        ("bench-llamacpp-duels", "benchmarks/speed/bench-humaneval-llamacpp.md", "## Head to head"),
        ("bench-rounds", "benchmarks/speed/bench-rounds.md"),
        ("llamacpp-flash-attn", "benchmarks/llamacpp/llamacpp-flash-attn.md"),
        ("loop-overhead-llamacpp-f32", "benchmarks/cost/loop-overhead-llamacpp-f32.md"),
        ("loop-overhead-llamacpp-q8_0", "benchmarks/cost/loop-overhead-llamacpp-q8_0.md"),
        ("loop-overhead-llamacpp-f32-built", "benchmarks/cost/loop-overhead-llamacpp-f32-built.md"),
        ("loop-overhead-llamacpp-q8_0-built", "benchmarks/cost/loop-overhead-llamacpp-q8_0-built.md"),
        ("earn-llamacpp-f32", "benchmarks/draft-policy/earn-llamacpp-f32.md"),
        ("earn-llamacpp-q8_0", "benchmarks/draft-policy/earn-llamacpp-q8_0.md"),
        ("earn-hf", "benchmarks/draft-policy/earn-hf.md"),
        ("earn-hf-coding", "benchmarks/draft-policy/earn-hf-coding.md"),
        ("earn-llamacpp-f32-coding", "benchmarks/draft-policy/earn-llamacpp-f32-coding.md"),
        ("earn-hf-math", "benchmarks/draft-policy/earn-hf-math.md"),
        ("earn-llamacpp-f32-math", "benchmarks/draft-policy/earn-llamacpp-f32-math.md"),
        ("earn-llamacpp-q8_0-coding", "benchmarks/draft-policy/earn-llamacpp-q8_0-coding.md"),
        ("earn-llamacpp-q8_0-math", "benchmarks/draft-policy/earn-llamacpp-q8_0-math.md"),
        ("llamacpp-time-split", "benchmarks/cost/llamacpp-time-split.md"),
        ("llamacpp-time-split-widths", "benchmarks/cost/llamacpp-time-split.md", "## Verify forwards by width"),
        ("draft-second-opinions", "benchmarks/draft-policy/draft-second-opinions-from-100.md"),
        (
            "draft-second-opinions-split",
            "benchmarks/draft-policy/draft-second-opinions-from-100.md",
            "By second opinion",
        ),
        ("staged-draft-ab", "benchmarks/draft-policy/staged-draft-ab.md"),
        ("earn-staged-ab-f32-math", "benchmarks/draft-policy/earn-staged-ab-llamacpp-f32-math.md"),
        ("earn-staged-ab-q8_0", "benchmarks/draft-policy/earn-staged-ab-llamacpp-q8_0.md"),
        ("lookup-agreement-ab", "benchmarks/draft-policy/lookup-agreement-ab.md"),
        ("conf-cap-ab", "benchmarks/draft-policy/conf-cap-ab.md"),
        ("conf-cap-ab-heldout", "benchmarks/draft-policy/conf-cap-ab-from-100.md"),
        ("cost-curve-llamacpp", "benchmarks/cost/cost-code-llamacpp.md", "## Milliseconds per forward"),
        (
            "cost-curve-llamacpp-quantized",
            "benchmarks/cost/cost-code-llamacpp-quantized.md",
            "## Milliseconds per forward",
        ),
    ),
    "docs/usage.md": (("healing", "benchmarks/methods/healing-humaneval.md"),),
    "docs/methods.md": (
        ("eagle3-hf", "benchmarks/speed/bench-humaneval-eagle3.md", GREEDY),
        ("suffix-replay", "benchmarks/methods/replay-humaneval.md"),
    ),
    "docs/backends.md": (
        ("llamacpp-draft-gguf", "benchmarks/llamacpp/llamacpp-draft-gguf.md"),
        ("llamacpp-precision", "benchmarks/llamacpp/llamacpp-precision.md"),
        ("lean-draft", "benchmarks/cost/lean-draft.md", "## Milliseconds per draft forward"),
        ("lean-draft-generation", "benchmarks/cost/lean-draft.md", "## Generation"),
    ),
    "docs/serving.md": (
        ("bench-batch", "benchmarks/batch/bench-batch.md"),
        ("load-test", "benchmarks/serving/load-test.md", "## Summary"),
        ("load-test-rss", "benchmarks/serving/load-test.md", "## Resident memory"),
        ("load-test-mixed", "benchmarks/serving/load-test-mixed.md", "## Summary"),
        ("load-test-mixed-equal", "benchmarks/serving/load-test-mixed.md", "Every answered request"),
        ("serve-llamacpp", "benchmarks/serving/llamacpp.md", "Command:"),
        ("serve-llamacpp-versus", "benchmarks/serving/llamacpp.md", "## Ours against"),
        ("serve-llamacpp-scaling", "benchmarks/serving/llamacpp.md", "## Throughput over"),
        ("serve-llamacpp-short-gamma", "benchmarks/serving/llamacpp-short-gamma.md", "Command:"),
        ("serve-llamacpp-short-gamma-versus", "benchmarks/serving/llamacpp-short-gamma.md", "## Ours against"),
        ("serve-llamacpp-suffix", "benchmarks/serving/llamacpp-suffix.md", "Command:"),
        ("serve-llamacpp-suffix-versus", "benchmarks/serving/llamacpp-suffix.md", "## Ours against"),
    ),
    "docs/zoo.md": (
        ("held-out", "benchmarks/zoo/zoo-held-out.md"),
        ("bpd-efficiency", "benchmarks/methods/bpd-humaneval.md", "## Block efficiency"),
        ("bpd-duel", "benchmarks/methods/bpd-humaneval.md", "## Neural-rescored vs plain"),
    ),
    "docs/benchmarks.md": (
        ("bench-greedy", "benchmarks/speed/bench-humaneval.md", GREEDY),
        ("bench-sampling", "benchmarks/speed/bench-humaneval.md", "## Temperature 1"),
        ("bench-bild", "benchmarks/speed/bench-humaneval.md", "## Lossy methods"),
        ("bench-compiled", "benchmarks/speed/bench-humaneval-compiled.md", GREEDY),
        ("gemv-floor", "benchmarks/cost/gemv-floor.md"),
        ("gpu-core", "benchmarks/gpu/bench-NVIDIA-H200-core.md", GREEDY),
        ("gpu-core-duels", "benchmarks/gpu/bench-NVIDIA-H200-core.md", "## Head to head"),
        ("gpu-rest", "benchmarks/gpu/bench-NVIDIA-H200.md", GREEDY),
        ("gpu-cost", "benchmarks/gpu/cost-NVIDIA-H200.md", "## Milliseconds per forward"),
        ("bench-blockwise", "benchmarks/speed/bench-humaneval-blockwise.md", GREEDY),
        ("cost-curve", "benchmarks/cost/cost-code.md", "## Milliseconds per forward"),
        ("cost-equality", "benchmarks/cost/cost-code.md", "## Greedy equality"),
        ("bench-othertok", "benchmarks/speed/bench-humaneval-othertok.md", GREEDY),
        ("cold-start", "benchmarks/speed/cold-start.md"),
        ("loop-overhead", "benchmarks/cost/loop-overhead.md"),
    ),
    "docs/translation.md": (
        ("translate-specdec", "benchmarks/translation/translate-specdec.md"),
        ("translate-step-cost", "benchmarks/translation/translate-specdec.md", "## What a step costs"),
    ),
}
TABLES: tuple[TableSource, ...] = tuple(TableSource(page, *row) for page, rows in _PAGES.items() for row in rows)

# marked blocks that are not tables, written by the commands that make them (the zoo target's sample completions)
NOT_TABLES = frozenset({"humaneval-sample"})

_MARKER = re.compile(r"<!-- ([\w.-]+):begin -->\n(.*?)<!-- \1:end -->", re.S)


def first_table(text: str, after: str | None) -> str | None:
    """The first markdown table in text (after the first occurrence of `after`, when given); None if there is none."""
    if after is not None:
        start = text.find(after)
        if start < 0:
            return None
        text = text[start:]
    table: list[str] = []
    for line in text.splitlines():
        if line.startswith("|"):
            table.append(line)
        elif table:
            break
    return "\n".join(table) if table else None


def block(root: Path, entry: TableSource) -> str:
    """What goes between an entry's markers: the table, then the file it came from."""
    path = root / entry.source
    if not path.is_file():
        raise DraftVerifyError(
            f"{entry.source} not found (table {entry.marker!r} of {entry.page}): run the "
            f"benchmark that writes it, or point TABLES in draftverify/docs_tables.py at its file"
        )
    table = first_table(path.read_text(encoding="utf-8"), entry.after)
    if table is None:
        where = f"after {entry.after!r}" if entry.after else "anywhere"
        raise DraftVerifyError(
            f"{entry.source} has no table {where} (table {entry.marker!r} of {entry.page}): "
            f"fix the file or the entry in TABLES in draftverify/docs_tables.py"
        )
    return f"{table}\n\n<sub>From `{entry.source}`.</sub>\n"


def refreshed(root: Path, tables: tuple[TableSource, ...] | None = None) -> dict[str, tuple[str, str]]:
    """Each page named in tables -> (its text now, its text with every marked table copied afresh).

    Raises DraftVerifyError when a page, a benchmark file or a table is missing, or a page marks a table that
    tables does not name (a table nobody would refresh). tables defaults to TABLES.
    """
    tables = TABLES if tables is None else tables
    pages: dict[str, tuple[str, str]] = {}
    for page in dict.fromkeys(entry.page for entry in tables):
        path = root / page
        if not path.is_file():
            raise DraftVerifyError(
                f"{page} not found under {root}: run this from the repository root (or give "
                f"--root), or fix TABLES in draftverify/docs_tables.py"
            )
        old = path.read_text(encoding="utf-8")
        entries = {entry.marker: entry for entry in tables if entry.page == page}
        marked = [m.group(1) for m in _MARKER.finditer(old) if m.group(1) not in NOT_TABLES]
        unmarked = sorted(entries.keys() - set(marked))
        if unmarked:
            raise DraftVerifyError(
                f"{page} has no <!-- NAME:begin --> / <!-- NAME:end --> pair for "
                f"{', '.join(unmarked)}, which TABLES in draftverify/docs_tables.py copies there"
            )
        unknown = sorted(set(marked) - entries.keys())
        if unknown:
            raise DraftVerifyError(
                f"{page} marks tables that TABLES in draftverify/docs_tables.py does not name "
                f"({', '.join(unknown)}): add their benchmark files there, or remove the markers"
            )

        def fill(m: re.Match[str]) -> str:
            name = m.group(1)
            if name in NOT_TABLES:
                return m.group(0)
            return f"<!-- {name}:begin -->\n{block(root, entries[name])}<!-- {name}:end -->"

        new = _MARKER.sub(fill, old)
        pages[page] = (old, new)
    return pages


def stale_pages(root: Path, tables: tuple[TableSource, ...] | None = None) -> list[str]:
    """The pages whose marked tables differ from their benchmark files (nothing is written)."""
    return [page for page, (old, new) in refreshed(root, tables).items() if old != new]


def update_pages(root: Path, tables: tuple[TableSource, ...] | None = None) -> list[str]:
    """Copy every marked table afresh from its benchmark file; returns the pages that changed."""
    changed = []
    for page, (old, new) in refreshed(root, tables).items():
        if old != new:
            (root / page).write_text(new, encoding="utf-8")
            changed.append(page)
    return changed

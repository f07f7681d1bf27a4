"""The markdown pieces every report shares, one way each: tables (bench and reproduce reports, training cards,
serving load tests) and the block that shows the command reproducing a report. Standard library only, so a light
module (a load-test client, a card) can use it without torch."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def markdown_table(columns: Sequence[str], rows: Iterable[Sequence[object]], align: str = "") -> list[str]:
    """A markdown table's lines: the header of `columns` (an empty one written `| |`, as the cards' row-label
    column), the rule, then a line per row (each cell as str() gives it). align: one letter a column, l (---) or r
    (---:, right-aligned); empty: every column l. Raises ValueError when align does not give one letter a column."""
    if align and (len(align) != len(columns) or set(align) - {"l", "r"}):
        raise ValueError(f"markdown_table: align {align!r} must be l or r for each of the {len(columns)} columns")
    header = "|" + "|".join(f" {c} " if c else " " for c in columns) + "|"
    rule = "|" + "".join("---:|" if a == "r" else "---|" for a in (align or "l" * len(columns)))
    return [header, rule] + ["| " + " | ".join(map(str, row)) + " |" for row in rows]


def command_block(title: str, command: str, language: str = "bash") -> list[str]:
    """`title` (e.g. "Reproduce:"), a blank line, then `command` in a code block marked `language` ("" for none, as
    the training cards have it): the lines a report or a card shows the command that made it with."""
    return [title, "", f"```{language}", command, "```"]

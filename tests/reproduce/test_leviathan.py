"""`draftverify reproduce leviathan`: the paper's Table 1 and Table 4's EXP column, each printed beside what
draftverify.theory computes from the same inputs."""

from __future__ import annotations

from typer.testing import CliRunner

from draftverify.cli import app


def table_rows(text: str, heading: str) -> list[list[str]]:
    """The cells of the markdown table under the first line starting with heading (header and rule left out)."""
    lines = text[text.index(heading) :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def printed() -> str:
    result = CliRunner().invoke(app, ["reproduce", "leviathan"])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_table_1_computed_equals_printed_on_every_row():
    rows = table_rows(printed(), "## Table 1")
    assert [(alpha, gamma) for alpha, gamma, *_ in rows] == [
        ("0.6", "2"),
        ("0.7", "3"),
        ("0.8", "2"),
        ("0.8", "5"),
        ("0.9", "2"),
        ("0.9", "10"),
    ]
    for _, _, ops_paper, ops_theory, speed_paper, speed_theory in rows:
        assert (ops_paper, speed_paper) == (ops_theory, speed_theory)


def test_table_4_differs_from_the_print_only_where_its_rounded_c_makes_it_a_tenth_lower():
    rows = table_rows(printed(), "## Table 4")
    assert len(rows) == 12
    lower = [(model, temp) for model, temp, *_, paper, theory in rows if paper != theory]
    assert lower == [("EnDe/T5-base", "1"), ("EnDe/T5-large", "1"), ("CNNDM/T5-large", "1")]
    for *_, paper, theory in rows:
        assert round(float(paper) - float(theory), 6) in (0.0, 0.1)

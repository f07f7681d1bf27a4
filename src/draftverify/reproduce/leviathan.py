"""`draftverify reproduce leviathan`: Leviathan, Kalman & Matias's (ICML 2023) closed-form tables, computed by
draftverify.theory beside the values the paper prints.

- Table 1: for each (alpha, gamma), the expected factor of arithmetic operations (Theorem 10 with c_hat = 0) and
  of walltime improvement (Theorem 8 with c = 0), both relative to plain decoding.
- Table 4, its EXP column: Theorem 8 at each row's printed alpha, gamma and cost coefficient c (T5-XXL targets with
  T5 drafts; EnDe translation and CNN/DM summarization, temperatures 0 and 1). On three rows the paper prints one
  tenth more than the printed c gives: c is printed rounded to two decimals (tests/test_theory.py finds one
  unrounded c per draft model that reproduces all twelve).

No model runs here and nothing is timed: the paper's measured side (alpha and the walltime of each drafter) is
what `draftverify bench speed` measures on our models, with Theorem 8's prediction beside each row.
"""

from __future__ import annotations

from ..markdown import markdown_table
from ..theory import operations_factor, walltime_factor

# the paper's numbers as printed (tests/test_theory.py checks theory.py against them)
# Table 1, as printed: alpha, gamma, OPERATIONS, SPEED (c = c_hat = 0)
TABLE_1 = (
    (0.6, 2, 1.53, 1.96),
    (0.7, 3, 1.58, 2.53),
    (0.8, 2, 1.23, 2.44),
    (0.8, 5, 1.63, 3.69),
    (0.9, 2, 1.11, 2.71),
    (0.9, 10, 1.60, 6.86),
)
# Table 4, as printed: task/draft model, TEMP, gamma, alpha, c, EXP
TABLE_4 = (
    ("EnDe/T5-small", 0, 7, 0.75, 0.02, 3.2),
    ("EnDe/T5-base", 0, 7, 0.8, 0.04, 3.3),
    ("EnDe/T5-large", 0, 7, 0.82, 0.11, 2.5),
    ("EnDe/T5-small", 1, 7, 0.62, 0.02, 2.3),
    ("EnDe/T5-base", 1, 5, 0.68, 0.04, 2.4),
    ("EnDe/T5-large", 1, 3, 0.71, 0.11, 2.0),
    ("CNNDM/T5-small", 0, 5, 0.65, 0.02, 2.4),
    ("CNNDM/T5-base", 0, 5, 0.73, 0.04, 2.6),
    ("CNNDM/T5-large", 0, 3, 0.74, 0.11, 2.0),
    ("CNNDM/T5-small", 1, 5, 0.53, 0.02, 1.9),
    ("CNNDM/T5-base", 1, 3, 0.55, 0.04, 1.8),
    ("CNNDM/T5-large", 1, 3, 0.56, 0.11, 1.6),
)


def table_1() -> list[str]:
    """Table 1's rows, printed and computed (rounded to two decimals, as the paper prints them)."""
    rows = [
        [
            f"{alpha:g}",
            str(gamma),
            f"{ops:.2f}",
            f"{operations_factor(alpha, gamma, 0.0):.2f}",
            f"{speed:.2f}",
            f"{walltime_factor(alpha, gamma, 0.0):.2f}",
        ]
        for alpha, gamma, ops, speed in TABLE_1
    ]
    columns = ("alpha", "gamma", "operations (paper)", "operations (Theorem 10)", "speed (paper)", "speed (Theorem 8)")
    return markdown_table(columns, rows)


def table_4() -> list[str]:
    """Table 4's EXP column, printed and computed from the printed alpha, gamma and c (one decimal, as printed)."""
    rows = [
        [model, str(temp), str(gamma), f"{alpha:g}", f"{c:g}", f"{exp:.1f}", f"{walltime_factor(alpha, gamma, c):.1f}"]
        for model, temp, gamma, alpha, c, exp in TABLE_4
    ]
    return markdown_table(("task/draft", "temperature", "gamma", "alpha", "c", "EXP (paper)", "Theorem 8"), rows)


def report() -> str:
    """Both tables as markdown, each under the heading naming the paper's table."""
    return "\n".join(
        [
            "## Table 1: operations and speed against alpha and gamma (c = c_hat = 0)",
            "",
            *table_1(),
            "",
            "## Table 4, EXP: Theorem 8 at the printed alpha, gamma and c",
            "",
            *table_4(),
        ]
    )

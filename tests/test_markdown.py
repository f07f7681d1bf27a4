import pytest

from draftverify.markdown import command_block, markdown_table


def test_a_table_is_its_header_rule_and_a_line_per_row_with_cells_as_text():
    assert markdown_table(("name", "tok/s"), [("a", 1.5), ("b", 2)]) == [
        "| name | tok/s |",
        "|---|---|",
        "| a | 1.5 |",
        "| b | 2 |",
    ]


def test_an_empty_header_cell_is_written_as_one_space():
    assert markdown_table(("", "loss"), [("before", "1.0")])[0] == "| | loss |"


def test_align_right_aligns_the_columns_it_marks_r():
    assert markdown_table(("row", "x", "y"), [], "lrr")[1] == "|---|---:|---:|"


@pytest.mark.parametrize("align", ["lr", "lrrr", "lcr"])
def test_an_align_without_one_letter_l_or_r_a_column_is_refused(align):
    with pytest.raises(ValueError, match="each of the 3 columns"):
        markdown_table(("a", "b", "c"), [], align)


def test_a_command_block_is_its_title_then_the_command_fenced_as_bash():
    assert command_block("Reproduce:", "draftverify bench speed") == [
        "Reproduce:",
        "",
        "```bash",
        "draftverify bench speed",
        "```",
    ]

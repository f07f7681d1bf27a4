"""The docs' measured tables match benchmarks/, `draftverify docs tables` refreshes them and fails loudly on a missing
file, and README.md's relative links (into docs/ above all) point at files and headings that exist."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest
from typer.testing import CliRunner

from draftverify.cli import app
from draftverify.docs_tables import TABLES, TableSource, stale_pages, update_pages
from draftverify.errors import DraftVerifyError

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()

BENCH = """# a benchmark

intro

| a | b |
|---|---|
| 1 | 2 |

## Second

| c |
|---|
| 3 |
"""


def small_repo(tmp_path: Path, page_text: str) -> Path:
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "x.md").write_text(BENCH)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text(page_text)
    return tmp_path


MARKED = (
    "# Page\n\n<!-- first:begin -->\nold\n<!-- first:end -->\n\ntext\n\n<!-- second:begin -->\n<!-- second:end -->\n"
)
ENTRIES = (
    TableSource("docs/page.md", "first", "benchmarks/x.md"),
    TableSource("docs/page.md", "second", "benchmarks/x.md", "## Second"),
)


def test_the_repository_tables_match_their_benchmark_files():
    assert stale_pages(ROOT) == [], "run `draftverify docs tables` to copy the tables from benchmarks/"


def test_the_check_command_passes_on_the_repository_and_writes_nothing():
    before = {entry.page: (ROOT / entry.page).read_text() for entry in TABLES}
    result = runner.invoke(app, ["docs", "tables", "--check", "--root", str(ROOT)])
    assert result.exit_code == 0, result.output
    assert {page: (ROOT / page).read_text() for page in before} == before


def test_tables_are_copied_between_markers_with_their_source_and_then_stay(tmp_path):
    repo = small_repo(tmp_path, MARKED)
    assert stale_pages(repo, ENTRIES) == ["docs/page.md"]
    assert update_pages(repo, ENTRIES) == ["docs/page.md"]
    text = (repo / "docs" / "page.md").read_text()
    assert "<!-- first:begin -->\n| a | b |\n|---|---|\n| 1 | 2 |\n\n<sub>From `benchmarks/x.md`.</sub>\n" in text
    assert "<!-- second:begin -->\n| c |\n|---|\n| 3 |\n" in text
    assert "old" not in text and "text" in text
    assert update_pages(repo, ENTRIES) == [] and stale_pages(repo, ENTRIES) == []


def test_a_missing_benchmark_file_fails_naming_it(tmp_path):
    repo = small_repo(tmp_path, MARKED)
    (repo / "benchmarks" / "x.md").unlink()
    with pytest.raises(DraftVerifyError, match=r"benchmarks/x\.md not found \(table 'first' of docs/page\.md\)"):
        update_pages(repo, ENTRIES)
    assert (repo / "docs" / "page.md").read_text() == MARKED


def test_the_command_exits_2_on_a_missing_benchmark_file(tmp_path, monkeypatch):
    repo = small_repo(tmp_path, MARKED)
    (repo / "benchmarks" / "x.md").unlink()
    monkeypatch.setattr("draftverify.docs_tables.TABLES", ENTRIES)
    result = runner.invoke(app, ["docs", "tables", "--check", "--root", str(repo)])
    assert result.exit_code == 2
    assert "benchmarks/x.md not found" in result.output


def test_the_check_command_exits_1_on_a_stale_table(tmp_path, monkeypatch):
    repo = small_repo(tmp_path, MARKED)
    monkeypatch.setattr("draftverify.docs_tables.TABLES", ENTRIES)
    result = runner.invoke(app, ["docs", "tables", "--check", "--root", str(repo)])
    assert result.exit_code == 1
    assert "stale: docs/page.md" in result.output
    assert (repo / "docs" / "page.md").read_text() == MARKED


@pytest.mark.parametrize(
    "page_text, problem",
    [
        ("<!-- first:begin -->\n<!-- first:end -->\n", "no <!-- NAME:begin --> / <!-- NAME:end --> pair for second"),
        (MARKED + "<!-- third:begin -->\n<!-- third:end -->\n", r"does not name \(third\)"),
    ],
)
def test_markers_and_entries_must_agree(tmp_path, page_text, problem):
    repo = small_repo(tmp_path, page_text)
    with pytest.raises(DraftVerifyError, match=problem):
        stale_pages(repo, ENTRIES)


def test_a_missing_table_fails_naming_the_heading(tmp_path):
    repo = small_repo(tmp_path, MARKED)
    entries = (ENTRIES[0], TableSource("docs/page.md", "second", "benchmarks/x.md", "## Absent"))
    with pytest.raises(DraftVerifyError, match="no table after '## Absent'"):
        stale_pages(repo, entries)


def slug(heading: str) -> str:
    """The anchor MkDocs gives a heading (Python-Markdown's toc slugify)."""
    text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def headings(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {slug(m.group(1).replace("`", "")) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


def test_readme_links_point_at_files_and_headings_that_exist():
    readme = ROOT / "README.md"
    text = re.sub(r"```.*?```", "", readme.read_text(), flags=re.S)
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert any(link.startswith("docs/") for link in local)
    broken = []
    for link in local:
        target, _, anchor = link.partition("#")
        path = ROOT / target if target else readme
        if not path.exists():
            broken.append(link)
        elif anchor and path.suffix == ".md" and anchor not in headings(path):
            broken.append(link)
    assert broken == []


def test_files_the_docs_name_exist():
    """A benchmark file, script or test the docs name by its path is there (after files move, the docs follow); a
    deleted probe is named with the commit that still has it ("`scripts/x.py` at commit `fa3270a`")."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    named = {
        m.group(0)
        for page in pages
        for m in re.finditer(
            r"(?<![\w/.-])(?:benchmarks|scripts|tests|src|zoo)/[\w./-]*\w\.(?:md|py|sh|json|png|safetensors)\b"
            r"(?!`?\s+at\s+commit\b)",
            page.read_text(),
        )
    }
    assert len(named) > 50
    assert sorted(path for path in named if not (ROOT / path).exists()) == []


@pytest.mark.parametrize("page", ["README.md", "docs/methods.md"])
def test_the_methods_tables_list_every_registered_method(page):
    from draftverify.methods import METHODS

    text = (ROOT / page).read_text()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    listed = {name for row in rows for name in re.findall(r"`([\w+]+)`", row.split("|")[1])}
    assert set(METHODS) <= listed

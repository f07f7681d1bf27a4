"""The CI guard against tests that read this machine's own paths (tests/path_audit.py)."""

from __future__ import annotations

import os

from path_audit import PathAudit, outside


def test_paths_inside_a_root_are_allowed_and_siblings_are_not(tmp_path):
    repo = tmp_path / "clone"
    roots = (str(repo),)
    assert not outside(str(repo / "zoo" / "code" / "target" / "config.json"), roots)
    assert not outside(str(repo), roots)
    assert outside(str(tmp_path / "clone-runs" / "corpus"), roots)  # a shared prefix is not containment
    assert outside(str(tmp_path / "runs" / "corpus-src" / "a.py"), roots)


def test_the_hook_records_absolute_and_relative_opens_outside(tmp_path, monkeypatch):
    repo = tmp_path / "clone"
    repo.mkdir()
    audit = PathAudit(repo)
    audit.roots = (os.path.realpath(repo),)  # only the clone, so the test's tmp_path counts as outside
    audit.hook("open", (str(repo / "README.md"), "r", 0))
    audit.hook("open", (str(tmp_path / "corpus.txt"), "r", 0))
    monkeypatch.chdir(repo)
    audit.hook("os.listdir", ("../runs",))
    audit.hook("open", (3, "r", 0))  # a file descriptor: nothing to check
    audit.hook("compile", (b"x", "<string>"))  # another event
    assert audit.seen == [str(tmp_path / "corpus.txt"), os.path.join(str(repo), "../runs")]


def test_the_python_environment_and_the_temporary_folder_are_allowed(tmp_path):
    audit = PathAudit(tmp_path / "clone")
    audit.hook("open", (os.__file__, "r", 0))
    audit.hook("open", (str(tmp_path / "scratch.txt"), "w", 0))
    assert audit.seen == []

"""A pytest plugin that fails any test which opens a file outside what a fresh machine has.

A suite that passes only on the machine that trained the zoo (a corpus under runs/, a cache in ~/.cache) hides
what a user's clone lacks. With DRAFTVERIFY_PATH_AUDIT=1 (set by .ci/run, which also points HOME at an empty
folder), every `open` / `os.listdir` / `os.scandir` of an absolute path is checked against the places a fresh
clone may read: the clone itself, the Python installation and its environment, the temporary folder (HOME
included, when it lies there) and the operating system's own trees. A test that opens anything else fails in
its teardown with the path and the test named. Child processes (the CLI tests' subprocesses) are not audited.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

ENV = "DRAFTVERIFY_PATH_AUDIT"
AUDITED_EVENTS = {"open", "os.listdir", "os.scandir"}
SYSTEM_TREES = ("/proc", "/sys", "/dev", "/etc", "/usr", "/lib", "/lib64", "/bin", "/sbin", "/run", "/var/lib/dpkg")


def allowed_roots(repo: Path) -> tuple[str, ...]:
    roots = {
        str(repo),
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        tempfile.gettempdir(),
        *SYSTEM_TREES,
        *(sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")),
    }
    roots.add(os.path.expanduser("~"))  # .ci/run points HOME at an empty folder of its own
    return tuple(sorted({os.path.realpath(r) for r in roots}))


def outside(path: str, roots: tuple[str, ...]) -> bool:
    real = os.path.realpath(path)
    return not any(real == root or real.startswith(root.rstrip("/") + "/") for root in roots)


class PathAudit:
    def __init__(self, repo: Path):
        self.roots = allowed_roots(repo)
        self.seen: list[str] = []
        self.reported = 0  # seen[:reported] were already charged to a test
        self.active = True

    def hook(self, event: str, args: tuple) -> None:
        if not self.active or event not in AUDITED_EVENTS or not args:
            return
        path = args[0]
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not isinstance(path, (str, os.PathLike)):
            return  # a file descriptor
        path = os.fspath(path)
        if not os.path.isabs(path):
            path = os.path.join(os.getcwd(), path)
        self.active = False  # realpath may itself raise audited events
        try:
            if outside(path, self.roots):
                self.seen.append(path)
        finally:
            self.active = True


AUDIT_KEY = pytest.StashKey[PathAudit]()


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get(ENV) == "1":
        audit = PathAudit(Path(__file__).resolve().parents[1])
        sys.addaudithook(audit.hook)
        config.stash[AUDIT_KEY] = audit


@pytest.fixture(autouse=True)
def _no_paths_outside_the_clone(request: pytest.FixtureRequest):
    audit = request.config.stash.get(AUDIT_KEY, None)
    if audit is None:
        yield
        return
    yield
    opened = sorted(set(audit.seen[audit.reported :]))  # a session fixture's opens are charged to its first user
    audit.reported = len(audit.seen)
    if opened:
        pytest.fail(
            f"{request.node.nodeid} opened paths outside the clone, the Python environment and the "
            f"temporary folder (a fresh machine has none of them): {', '.join(opened[:5])}",
            pytrace=False,
        )

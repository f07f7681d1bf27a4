"""Package sources for the code corpus: licence reading, the permissive allow-list, unpacking, deduplication."""

import json
import zipfile

import pytest

from draftverify.train import packages
from draftverify.train.corpus import build_manifest, iter_texts


def make_wheel(path, name, version, metadata_lines, files):
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(
            f"{name}-{version}.dist-info/METADATA",
            "\n".join([f"Name: {name}", f"Version: {version}", *metadata_lines]) + "\n\nlong description\n",
        )
        for rel, text in files.items():
            zf.writestr(rel, text)
    return path


@pytest.mark.parametrize(
    "licence, ok",
    [
        ("MIT", True),
        ("BSD-3-Clause", True),
        ("Apache-2.0 AND MIT", True),
        ("Python Software Foundation License", True),
        ("GPL-3.0-or-later", False),
        ("Public Domain OR BSD License OR GNU General Public License (GPL)", False),
        ("MPL-2.0", False),
        ("UNKNOWN", False),
        ("Proprietary", False),
    ],
)
def test_is_permissive(licence, ok):
    assert packages.is_permissive(licence) is ok


def test_wheel_license_prefers_expression_then_classifiers(tmp_path):
    w1 = make_wheel(
        tmp_path / "a-1.0-py3-none-any.whl",
        "a",
        "1.0",
        ["License-Expression: MIT", "Classifier: License :: OSI Approved :: GNU General Public License"],
        {},
    )
    w2 = make_wheel(
        tmp_path / "b-1.0-py3-none-any.whl",
        "b",
        "1.0",
        ["License: see file", "Classifier: License :: OSI Approved :: BSD License"],
        {},
    )
    w3 = make_wheel(tmp_path / "c-1.0-py3-none-any.whl", "c", "1.0", ["License: Apache 2.0 License"], {})
    assert packages.wheel_license(w1) == "MIT"
    assert packages.wheel_license(w2) == "BSD License"
    assert packages.wheel_license(w3) == "Apache 2.0 License"


def test_unpack_keeps_permissive_py_files_and_manifest_records_licences(tmp_path, monkeypatch):
    stdlib = tmp_path / "stdlib"
    stdlib.mkdir()
    (stdlib / "os2.py").write_text("def f():\n    return 1\n")
    monkeypatch.setattr(packages, "stdlib_root", lambda: stdlib)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_wheel(
        wheels / "good-2.0-py3-none-any.whl",
        "good",
        "2.0",
        ["License-Expression: BSD-3-Clause"],
        {"good/__init__.py": "X = 1\n", "good/copy.py": "def f():\n    return 1\n", "good/data.txt": "no"},
    )
    make_wheel(
        wheels / "bad-1.0-py3-none-any.whl",
        "bad",
        "1.0",
        ["License-Expression: GPL-3.0-only"],
        {"bad/__init__.py": "Y = 2\n"},
    )
    root = tmp_path / "src"
    used = packages.unpack_sources(wheels, root)
    assert [u.name for u in used] == ["cpython-stdlib", "good"]
    assert not (root / "bad-1.0").exists()
    assert not list(root.rglob("*.txt"))
    sources = [
        {"dir": "cpython-" + used[0].version, "license": "PSF-2.0"},
        {"dir": "good-2.0", "license": "BSD-3-Clause"},
    ]
    m = build_manifest(tmp_path / "m.json", root=root, val_fraction=0.0, sources=sources)
    paths = {f["path"]: f["license"] for f in m["files"]}
    assert paths["good-2.0/good/__init__.py"] == "BSD-3-Clause"
    # good/copy.py has the same content as the stdlib file: kept once
    assert sum(p.endswith(("os2.py", "copy.py")) for p in paths) == 1
    assert len(m["skipped"]) == 1
    assert json.loads((tmp_path / "m.json").read_text())["sources"][1]["license"] == "BSD-3-Clause"
    assert sorted(iter_texts(tmp_path / "m.json", "train")) == sorted(["X = 1\n", "def f():\n    return 1\n"])


def test_unpack_never_deletes_a_folder_it_did_not_make(tmp_path, monkeypatch):
    monkeypatch.setattr(packages, "stdlib_root", lambda: tmp_path / "empty-stdlib")
    (tmp_path / "empty-stdlib").mkdir()
    users = tmp_path / "users-code"
    users.mkdir()
    (users / "precious.py").write_text("x = 1\n")
    with pytest.raises(packages.CorpusError, match="was not made by"):
        packages.unpack_sources(tmp_path, users)
    assert (users / "precious.py").is_file()
    made = tmp_path / "made"
    packages.unpack_sources(tmp_path, made)
    packages.unpack_sources(tmp_path, made)  # its own folder is rebuilt
    assert (made / packages.MARKER).is_file()

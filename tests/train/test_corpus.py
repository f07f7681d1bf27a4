import json
import sysconfig
from pathlib import Path

import pytest
from tiny_corpus import write_tiny_corpus

from draftverify.train import corpus


def _build(tmp_path, root, name="m.json", **kw):
    return corpus.build_manifest(tmp_path / name, root=root, **kw)


def test_manifest_fields_and_exclusions(tmp_path):
    root = write_tiny_corpus(tmp_path / "lib", n_files=10)
    (root / "site-packages").mkdir()
    (root / "site-packages" / "third_party.py").write_text("x = 1\n")
    (root / "pkg0" / "dist-packages").mkdir()
    (root / "pkg0" / "dist-packages" / "other.py").write_text("y = 2\n")
    (root / "notes.txt").write_text("not python\n")
    (root / "latin1.py").write_bytes(b"# -*- coding: latin-1 -*-\ns = '\xe9'\n")
    m = _build(tmp_path, root, val_fraction=0.3)
    on_disk = json.loads((tmp_path / "m.json").read_text())
    assert on_disk == m
    paths = [f["path"] for f in m["files"]]
    assert len(paths) == 10
    assert all(p.endswith(".py") for p in paths)
    assert not any("site-packages" in p or "dist-packages" in p for p in paths)
    assert "latin1.py" in m["skipped"]
    import hashlib

    for f in m["files"]:
        data = (root / f["path"]).read_bytes()
        assert f["bytes"] == len(data)
        assert f["sha256"] == hashlib.sha256(data).hexdigest()
        assert f["split"] in ("train", "val")
    assert m["counts"]["train"] + m["counts"]["val"] == 10


def test_split_is_by_file_and_deterministic(tmp_path):
    root = write_tiny_corpus(tmp_path / "lib", n_files=40)
    m1 = _build(tmp_path, root, "a.json", val_fraction=0.25)
    m2 = _build(tmp_path, root, "b.json", val_fraction=0.25)
    assert m1["files"] == m2["files"]
    assert m1["files_sha256"] == m2["files_sha256"]
    assert 0 < m1["counts"]["val"] < 40
    # the split depends on the path alone: adding files does not move existing ones
    (root / "pkg1" / "zzz_new.py").write_text("z = 3\n")
    m3 = _build(tmp_path, root, "c.json", val_fraction=0.25)
    old = {f["path"]: f["split"] for f in m1["files"]}
    new = {f["path"]: f["split"] for f in m3["files"]}
    assert all(new[p] == s for p, s in old.items())
    assert m3["files_sha256"] != m1["files_sha256"]
    # whole files go to exactly one split
    train = list(corpus.iter_texts(m1, "train"))
    val = list(corpus.iter_texts(m1, "val"))
    assert len(train) == m1["counts"]["train"] and len(val) == m1["counts"]["val"]
    val_paths = {f["path"] for f in m1["files"] if f["split"] == "val"}
    for p in val_paths:
        assert (root / p).read_text() in val
    assert len(list(corpus.iter_texts(m1, "all"))) == 40


def test_split_for_fraction():
    paths = [f"pkg/mod_{i}.py" for i in range(5000)]
    frac = sum(corpus.split_for(p, 0.02) == "val" for p in paths) / len(paths)
    assert 0.012 < frac < 0.028
    assert corpus.split_for("a/b.py", 0.0) == "train"


def test_changed_file_is_detected(tmp_path):
    root = write_tiny_corpus(tmp_path / "lib", n_files=5)
    m = _build(tmp_path, root)
    victim = root / m["files"][0]["path"]
    victim.write_text(victim.read_text() + "# edited\n")
    with pytest.raises(corpus.CorpusError, match="sha256"):
        list(corpus.iter_texts(m, "all"))
    with pytest.raises(corpus.CorpusError):
        list(corpus.iter_texts(m, "test"))
    with pytest.raises(corpus.CorpusError, match="not found"):
        corpus.load_manifest(tmp_path / "missing.json")


def test_stdlib_manifest(tmp_path):
    m = corpus.build_manifest(tmp_path / "stdlib.json")
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    assert Path(m["root"]) == stdlib
    n = len(m["files"])
    assert n > 500
    assert not any("site-packages" in f["path"] or "dist-packages" in f["path"] for f in m["files"])
    assert any(f["path"] == "os.py" for f in m["files"])
    frac = m["counts"]["val"] / n
    assert 0.005 < frac < 0.05


def test_a_packages_manifest_from_another_checkout_reads_this_ones_corpus_folder(tmp_path, monkeypatch):
    """The shipped manifest records the absolute folder it was built in; on another machine the files are where
    `draftverify train corpus` puts them here (runs/corpus-src under the working directory)."""
    root = write_tiny_corpus(tmp_path / "elsewhere" / "runs" / "corpus-src", n_files=4)
    m = _build(
        tmp_path, root, sources=[{"dir": "pkg0", "name": "pkg0", "version": "1", "license": "MIT", "wheel": "pkg0.whl"}]
    )
    assert m["source"] == "packages"
    here = tmp_path / "checkout"
    (here / "runs").mkdir(parents=True)
    (tmp_path / "elsewhere" / "runs" / "corpus-src").rename(here / "runs" / "corpus-src")
    monkeypatch.chdir(here)
    assert len(list(corpus.iter_texts(m, "all"))) == 4
    (here / "runs" / "corpus-src").rename(here / "runs" / "moved")
    with pytest.raises(corpus.CorpusError, match="rebuild the files with `draftverify train corpus"):
        list(corpus.iter_texts(m, "all"))


def test_a_root_inside_the_working_directory_is_recorded_relative_to_it(tmp_path, monkeypatch):
    root = write_tiny_corpus(tmp_path / "runs" / "corpus-src", n_files=3)
    monkeypatch.chdir(tmp_path)
    m = _build(tmp_path, root)
    assert m["root"] == "runs/corpus-src"
    assert len(list(corpus.iter_texts(m, "all"))) == 3
    outside = write_tiny_corpus(tmp_path.parent / f"{tmp_path.name}-outside", n_files=3)
    assert _build(tmp_path, outside, name="o.json")["root"] == str(outside.resolve())

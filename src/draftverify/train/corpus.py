"""Corpus of Python source: the ``.py`` files of the standard library, optionally with permissive packages.

The manifest records, for each file, its path relative to the corpus root, its
sha256, its size in bytes, its split and (for multi-source corpora) its licence.
Files with the same content are kept once.  The validation split is held out *by
file*: a file is in ``val`` iff a hash of its relative path falls below
``val_fraction``, so the split is deterministic, independent of file order and
stable when files are added or removed.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import sys
import sysconfig
from pathlib import Path
from typing import Iterator

MANIFEST_VERSION = 1
EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})
SPLIT_SALT = "draftverify-split-v1:"
DEFAULT_VAL_FRACTION = 0.02
SPLITS = ("train", "val")


class CorpusError(RuntimeError):
    """Raised for missing/corrupt manifests or changed corpus files."""


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"]).resolve()


def split_for(rel_path: str, val_fraction: float = DEFAULT_VAL_FRACTION) -> str:
    """Deterministic split assignment from the relative path alone."""
    h = hashlib.sha256((SPLIT_SALT + rel_path).encode("utf-8")).digest()
    u = int.from_bytes(h[:8], "big") / 2.0**64  # uniform in [0, 1)
    return "val" if u < val_fraction else "train"


def iter_source_files(root: Path) -> Iterator[Path]:
    """All ``*.py`` files below ``root`` (sorted), skipping site-/dist-packages."""
    root = Path(root)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDED_DIRS)
        for name in sorted(filenames):
            if name.endswith(".py"):
                yield Path(dirpath) / name


def files_hash(files: list[dict]) -> str:
    """Content hash of the manifest's file list (independent of the root path)."""
    canon = json.dumps(
        [[f["path"], f["sha256"], f["bytes"], f["split"]] for f in files],
        separators=(",", ":"),
    )
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()


def build_manifest(
    out_path: str | os.PathLike | None,
    root: str | os.PathLike | None = None,
    val_fraction: float = DEFAULT_VAL_FRACTION,
    sources: list[dict] | None = None,
) -> dict:
    """Scan ``root`` (default: the stdlib) and write the manifest JSON to ``out_path``.

    Files that are not valid UTF-8 (a few deliberately odd test files), contain NUL
    bytes, are empty or repeat an earlier file's content are skipped and counted
    under ``skipped``. ``sources`` (one dict per top-level folder of ``root``, with
    ``dir`` and ``license``) records where each file came from and under what licence.
    Returns the manifest dict.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise CorpusError(f"val_fraction must be in [0, 1), got {val_fraction}")
    root = Path(root).resolve() if root is not None else stdlib_root()
    if not root.is_dir():
        raise CorpusError(f"corpus root {root} is not a directory")
    licence_of = {s["dir"]: s["license"] for s in sources or []}
    files: list[dict] = []
    skipped: list[str] = []
    seen: set[str] = set()
    for p in iter_source_files(root):
        rel = p.relative_to(root).as_posix()
        try:
            data = p.read_bytes()
            data.decode("utf-8")
        except (OSError, UnicodeDecodeError):
            skipped.append(rel)
            continue
        digest = hashlib.sha256(data).hexdigest()
        if not data.strip() or b"\0" in data or digest in seen:
            skipped.append(rel)
            continue
        seen.add(digest)
        entry = {"path": rel, "sha256": digest, "bytes": len(data), "split": split_for(rel, val_fraction)}
        if licence_of:
            entry["license"] = licence_of.get(rel.split("/", 1)[0], "UNKNOWN")
        files.append(entry)
    if not files:
        raise CorpusError(f"no usable .py files found under {root}")
    counts = {s: sum(1 for f in files if f["split"] == s) for s in SPLITS}
    nbytes = {s: sum(f["bytes"] for f in files if f["split"] == s) for s in SPLITS}
    manifest = {
        "version": MANIFEST_VERSION,
        "source": "python-stdlib" if root == stdlib_root() else ("packages" if sources else "directory"),
        "description": "*.py files of the Python standard library "
        + ("and of permissively licensed packages from PyPI " if sources else "")
        + "(excluding site-packages/dist-packages), deduplicated, split by file",
        "sources": sources or [],
        "python_version": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "root": _recorded(root),
        "val_fraction": val_fraction,
        "split_rule": f"sha256('{SPLIT_SALT}' + path)[:8] / 2**64 < val_fraction -> val",
        "counts": counts,
        "bytes": nbytes,
        "skipped": skipped,
        "files_sha256": files_hash(files),
        "files": files,
    }
    if out_path is not None:
        out_path = Path(out_path)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = out_path.with_suffix(out_path.suffix + ".tmp")
        tmp.write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
        tmp.replace(out_path)
    return manifest


def load_manifest(manifest: str | os.PathLike | dict) -> dict:
    """A corpus manifest: as given (a dict), read from its JSON file, or built from a user's own text (a folder of
    text files or a .jsonl: data_manifest), so every recipe that reads the corpus reads the user's data alike."""
    if isinstance(manifest, dict):
        return manifest
    p = Path(manifest)
    if p.is_dir() or p.suffix == ".jsonl":
        return data_manifest(p)
    if not p.is_file():
        raise CorpusError(f"manifest {p} not found (build it with `draftverify train tokenizer`)")
    try:
        m = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise CorpusError(f"manifest {p} is not valid JSON: {e}") from None
    if not isinstance(m, dict) or "files" not in m or "root" not in m:
        raise CorpusError(f"{p} does not look like a draftverify corpus manifest")
    return m


TEXT_SUFFIXES = frozenset(
    ".txt .md .rst .py .pyi .c .h .cc .cpp .hpp .cu .java .kt .scala .js .jsx .ts .tsx .go .rs .rb .php .swift .m "
    ".cs .sh .bash .sql .r .jl .lua .pl .hs .ml .ex .exs .erl .clj .el .vim .tex .html .htm .css .scss .xml .json "
    ".yaml .yml .toml .ini .cfg".split()
)
DATA_VAL_FRACTION = 0.05  # of the user's documents held out (by path hash, as the corpus), at least one of two or more


def data_manifest(path: str | os.PathLike) -> dict:
    """A manifest over the user's own text (see _data_manifest), read once per process while the path is
    unchanged: the command checks it, then the recipe reads it."""
    p = Path(path)
    try:
        stamp = p.stat().st_mtime_ns
    except OSError:
        stamp = None
    return _data_manifest(str(p.resolve()), stamp)


@functools.lru_cache(maxsize=4)
def _data_manifest(path: str, stamp: int | None) -> dict:
    """A manifest over the user's own text, texts kept in memory: every text file below a folder (recursively, by
    suffix: TEXT_SUFFIXES), or every line of a .jsonl ({"text": ...}, or {"prompt": ..., "completion": ...}). Each
    file or line is a document; documents are split into train and val by a hash of their name, one held out at
    least when there are two or more. Raises CorpusError for a missing path, no text or a bad jsonl line."""
    p = Path(path)
    if not p.exists():
        raise CorpusError(f"--data {p}: no such file or folder")
    if p.is_file() and p.suffix != ".jsonl":
        raise CorpusError(f"--data {p}: give a folder of text files or a .jsonl file (one JSON object a line)")
    docs = _jsonl_documents(p) if p.is_file() else _folder_documents(p)
    if not docs:
        what = "lines with text" if p.is_file() else f"text files ({', '.join(sorted(TEXT_SUFFIXES)[:6])}, ...)"
        raise CorpusError(f"--data {p}: no {what} in it")
    files = []
    for name, text in docs:
        data = text.encode("utf-8")
        entry = {"path": name, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "text": text}
        files.append({**entry, "split": split_for(name, DATA_VAL_FRACTION)})
    if len(files) > 1 and all(f["split"] == "train" for f in files):
        min(files, key=lambda f: hashlib.sha256((SPLIT_SALT + f["path"]).encode()).digest())["split"] = "val"
    counts = {s: sum(1 for f in files if f["split"] == s) for s in SPLITS}
    return {
        "version": MANIFEST_VERSION,
        "source": "data",
        "description": f"the user's own text from {p}",
        "root": str(p if p.is_dir() else p.parent),
        "val_fraction": DATA_VAL_FRACTION,
        "counts": counts,
        "bytes": {s: sum(f["bytes"] for f in files if f["split"] == s) for s in SPLITS},
        "skipped": [],
        "files_sha256": files_hash(files),
        "files": files,
    }


def _folder_documents(root: Path) -> list[tuple[str, str]]:
    """(path relative to root, text) of every readable, non-empty UTF-8 text file below root, sorted."""
    docs = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in EXCLUDED_DIRS)
        for name in sorted(filenames):
            f = Path(dirpath) / name
            if f.suffix.lower() not in TEXT_SUFFIXES:
                continue
            try:
                text = f.read_bytes().decode("utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            if text.strip() and "\0" not in text:
                docs.append((f.relative_to(root).as_posix(), text))
    return docs


def _jsonl_documents(path: Path) -> list[tuple[str, str]]:
    """(file:line, text) of every line of a .jsonl: its "text", or its "prompt" followed by its "completion"."""
    try:
        lines = path.read_bytes().decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise CorpusError(f"--data {path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    docs = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise CorpusError(f"--data {where}: not a JSON object ({e.msg})") from None
        if not isinstance(record, dict):
            raise CorpusError(f"--data {where}: not a JSON object")
        if "text" in record:
            text = record["text"]
        elif "prompt" in record or "completion" in record:
            text = record.get("prompt", "") + record.get("completion", "") if _all_text(record) else None
        else:
            raise CorpusError(f'--data {where}: no "text" field (nor "prompt" / "completion")')
        if not isinstance(text, str):
            raise CorpusError(f"--data {where}: the text fields must be strings")
        if text.strip():
            docs.append((f"{path.name}:{number}", text))
    return docs


def _all_text(record: dict) -> bool:
    return all(isinstance(record.get(k, ""), str) for k in ("prompt", "completion"))


def _recorded(root: Path) -> str:
    """The root as the manifest records it: relative to the working directory when inside it (a checkout's
    runs/corpus-src), so the shipped manifest names no path of the machine that built it."""
    try:
        return root.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return str(root)


PACKAGES_ROOT = Path("runs/corpus-src")  # where `draftverify train corpus` unpacks the stdlib copy and the packages
REBUILD = "draftverify train corpus --out runs/corpus-manifest.json"  # rebuilds the files (pinned versions)


def corpus_root(m: dict) -> Path:
    """Where the manifest's files are: its recorded root, else, on another machine or checkout, where this one would
    have them: `draftverify train corpus`'s folder (relative to the working directory) or this Python's stdlib."""
    recorded = Path(m["root"])
    if recorded.is_dir():
        return recorded
    if m.get("source") == "packages":
        return PACKAGES_ROOT
    if m.get("source") == "python-stdlib":
        return stdlib_root()
    return recorded


def manifest_hash(manifest: str | os.PathLike | dict) -> str:
    m = load_manifest(manifest)
    return m.get("files_sha256") or files_hash(m["files"])


def iter_texts(
    manifest: str | os.PathLike | dict,
    split: str = "train",
    root: str | os.PathLike | None = None,
    verify: bool = True,
) -> Iterator[str]:
    """Yield the text of every file of ``split`` ("train", "val" or "all").

    With ``verify`` the sha256 of each file is checked against the manifest, so
    a different Python version cannot silently produce a different corpus.
    """
    if split not in (*SPLITS, "all"):
        raise CorpusError(f"unknown split {split!r}; expected train, val or all")
    m = load_manifest(manifest)
    base = Path(root) if root is not None else corpus_root(m)
    for f in m["files"]:
        if split != "all" and f["split"] != split:
            continue
        if "text" in f:  # the user's own data (data_manifest): read once, kept in memory
            yield f["text"]
            continue
        p = base / f["path"]
        try:
            data = p.read_bytes()
        except OSError as e:
            hint = f"; rebuild the files with `{REBUILD}`" if m.get("source") == "packages" else ""
            raise CorpusError(f"corpus file missing: {p} ({e.strerror}){hint}") from None
        if verify and hashlib.sha256(data).hexdigest() != f["sha256"]:
            raise CorpusError(
                f"corpus file {p} does not match the manifest sha256 (different Python version?); rebuild the manifest"
            )
        yield data.decode("utf-8")


if __name__ == "__main__":  # pragma: no cover
    m = build_manifest(sys.argv[1] if len(sys.argv) > 1 else None)
    print(json.dumps({k: v for k, v in m.items() if k != "files"}, indent=1))

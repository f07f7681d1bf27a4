"""More Python source for the code corpus: permissively licensed packages from the package index.

Wheels are fetched with pip (pinned versions, no dependencies), their licence is read from the wheel's own
metadata (License-Expression, else License, else the trove classifiers) and checked against an allow-list of
permissive licences, and their ``.py`` files are unpacked next to a copy of the standard library, so one corpus
root holds every source and the manifest can record each file's licence.
"""

from __future__ import annotations

import email.parser
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .corpus import CorpusError, stdlib_root

# SPDX identifiers (or classifier words) whose terms allow training on the code and shipping the model
PERMISSIVE = (
    "MIT",
    "MIT-CMU",
    "BSD",
    "BSD-2-Clause",
    "BSD-3-Clause",
    "0BSD",
    "Apache-2.0",
    "Apache",
    "PSF",
    "Python Software Foundation",
    "ISC",
    "Zlib",
    "CC0-1.0",
    "Unlicense",
    "Public Domain",
)
COPYLEFT = re.compile(r"\b(A?GPL|LGPL|MPL|EPL|CDDL|EUPL|GNU)", re.IGNORECASE)
MARKER = ".draftverify-corpus"
MAX_FILE_BYTES = 1_000_000  # larger .py files are generated tables, not code worth learning from


@dataclass(frozen=True)
class PackageSource:
    name: str
    version: str
    license: str
    wheel: str


def wheel_license(wheel: Path) -> str:
    """The licence a wheel declares, most specific field first."""
    with zipfile.ZipFile(wheel) as zf:
        meta_name = next((n for n in zf.namelist() if n.endswith(".dist-info/METADATA")), None)
        if meta_name is None:
            raise CorpusError(f"{wheel.name} has no METADATA; not a wheel?")
        meta = email.parser.Parser().parsestr(zf.read(meta_name).decode("utf-8", "replace"), headersonly=True)
    if meta.get("License-Expression"):
        return meta["License-Expression"].strip()
    classifiers = [c.split("::")[-1].strip() for c in meta.get_all("Classifier") or [] if c.startswith("License ::")]
    if classifiers:
        return " OR ".join(classifiers)
    return (meta.get("License") or "UNKNOWN").strip().splitlines()[0]


def is_permissive(license_text: str) -> bool:
    """True when every licence named is permissive (a copyleft name anywhere disqualifies the package)."""
    if COPYLEFT.search(license_text):
        return False
    return any(p.lower() in license_text.lower() for p in PERMISSIVE)


def fetch_wheels(requirements: list[str], wheel_dir: Path) -> None:
    """pip download the given requirements (no dependencies) for this interpreter into wheel_dir."""
    wheel_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(wheel_dir)]
    result = subprocess.run(cmd + requirements, capture_output=True, text=True)
    if result.returncode != 0:
        raise CorpusError(f"pip download failed for {' '.join(requirements)}:\n{result.stderr.strip()[-2000:]}")


def unpack_sources(wheel_dir: Path, out_root: Path) -> list[PackageSource]:
    """Copy the stdlib and every permissive wheel's .py files under out_root; return the packages used.

    out_root is rebuilt from scratch, so it must be new, empty, or one this function made (marked by MARKER):
    a folder of the user's is never deleted."""
    if out_root.exists() and any(out_root.iterdir()):
        if not (out_root / MARKER).is_file():
            raise CorpusError(
                f"{out_root} exists and was not made by `draftverify train corpus`; "
                "give a new or empty folder as --src-root"
            )
        shutil.rmtree(out_root)
    out_root.mkdir(parents=True, exist_ok=True)
    (out_root / MARKER).write_text("made by draftverify train corpus; rebuilt on every run\n")
    version = ".".join(map(str, sys.version_info[:3]))
    shutil.copytree(
        stdlib_root(),
        out_root / f"cpython-{version}",
        ignore=shutil.ignore_patterns("site-packages", "dist-packages", "__pycache__", "*.pyc", "*.so"),
    )
    used = [PackageSource("cpython-stdlib", version, "PSF-2.0", "")]
    for wheel in sorted(wheel_dir.glob("*.whl")):
        name, ver = wheel.name.split("-")[:2]
        licence = wheel_license(wheel)
        if not is_permissive(licence):
            print(f"skipping {wheel.name}: licence {licence!r} is not on the permissive allow-list")
            continue
        dest = out_root / f"{name.lower()}-{ver}"
        with zipfile.ZipFile(wheel) as zf:
            for info in zf.infolist():
                if info.filename.endswith(".py") and info.file_size <= MAX_FILE_BYTES:
                    zf.extract(info, dest)
        used.append(PackageSource(name.lower(), ver, licence, wheel.name))
    return used

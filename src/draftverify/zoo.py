"""Where the shipped model sets live, and what each one runs by default (no torch import: the CLI reads this
before anything heavy loads)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .errors import DraftVerifyError

ZOO_DEFAULT_METHOD = "earn"  # each step the draft that earns most: suffix cache, prompt lookup or the draft model
SETTINGS_NAME = "zoo.json"  # optional per-entry settings, e.g. {"default_method": "specdec"}


ZOO_ENV = "DRAFTVERIFY_ZOO"


def source_tree_zoo() -> Path:
    """The repository's zoo/ folder, which exists beside the sources in a checkout (and an editable install)."""
    return Path(__file__).resolve().parents[2] / "zoo"


def user_zoo() -> Path:
    """Where a normal (non-editable) install looks: $XDG_DATA_HOME/draftverify/zoo (~/.local/share/...)."""
    data_home = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(data_home) / "draftverify" / "zoo"


def zoo_root() -> Path:
    """Where shipped models live: $DRAFTVERIFY_ZOO, else the repository's zoo/ folder when the package runs from
    a checkout, else the user's data folder (where a copy of the repository's zoo/ goes after `pip install .`)."""
    if os.environ.get(ZOO_ENV):
        return Path(os.environ[ZOO_ENV])
    return source_tree_zoo() if source_tree_zoo().is_dir() else user_zoo()


def zoo_folder(name: str) -> Path:
    """The folder of zoo entry `name`, or an error that says where it was looked for and how to point at it."""
    root = zoo_root()
    folder = root / name
    if folder.is_dir():
        return folder
    available = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    if available:
        raise DraftVerifyError(f"no zoo entry {name!r} under {root}; available: {', '.join(available)}")
    if os.environ.get(ZOO_ENV):
        raise DraftVerifyError(
            f"${ZOO_ENV}={root} is not a zoo folder: point it at the zoo/ folder of a draftverify checkout"
        )
    raise DraftVerifyError(
        f"no zoo folder at {root}: copy the zoo/ folder of a draftverify checkout there, or set ${ZOO_ENV} to it"
    )


def zoo_default_method(name: str) -> str:
    """The entry's own default method (its zoo.json), else ZOO_DEFAULT_METHOD."""
    settings = zoo_root() / name / SETTINGS_NAME
    if settings.is_file():
        try:
            return str(json.loads(settings.read_text())["default_method"])
        except (json.JSONDecodeError, KeyError, TypeError):
            pass
    return ZOO_DEFAULT_METHOD


def zoos_with(part: str) -> list[str]:
    """The zoo entries that ship `part` (a file or folder name inside the entry, e.g. "nat"), sorted."""
    root = zoo_root()
    if not root.is_dir():
        return []
    return sorted(entry.name for entry in root.iterdir() if (entry / part).exists())


def shipped(part: str) -> str:
    """Which zoo entries ship `part`, as a phrase: "only the translate zoo ships one"."""
    entries = zoos_with(part)
    if not entries:
        return "no zoo entry ships one"
    return f"only the {entries[0]} zoo ships one" if len(entries) == 1 else f"the {', '.join(entries)} zoos ship one"


def trained_exit_layers() -> dict[str, int]:
    """Zoo entry -> the early-exit layer its target was trained with and kept (its training_report.json)."""
    root = zoo_root()
    out = {}
    for report in sorted(root.glob("*/target/training_report.json")) if root.is_dir() else []:
        try:
            data = json.loads(report.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(data, dict) and data.get("early_exit_kept") and isinstance(data.get("early_exit_layer"), int):
            out[report.parents[1].name] = data["early_exit_layer"]
    return out

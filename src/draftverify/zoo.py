"""Where the shipped model sets live, and what each one runs by default (no torch import: the CLI reads this
before anything heavy loads)."""
from __future__ import annotations

import json
import os
from pathlib import Path

ZOO_DEFAULT_METHOD = "lookup_model"  # copying where code repeats, the draft model elsewhere (the code zoo)
SETTINGS_NAME = "zoo.json"  # optional per-entry settings, e.g. {"default_method": "specdec"}


def zoo_root() -> Path:
    """Where shipped models live: $DRAFTVERIFY_ZOO, else the repository's zoo/ folder."""
    return Path(os.environ.get("DRAFTVERIFY_ZOO", Path(__file__).resolve().parents[2] / "zoo"))


def zoo_default_method(name: str) -> str:
    """The entry's own default method (its zoo.json), else ZOO_DEFAULT_METHOD."""
    settings = zoo_root() / name / SETTINGS_NAME
    if settings.is_file():
        try:
            return str(json.loads(settings.read_text())["default_method"])
        except (json.JSONDecodeError, KeyError, TypeError):
            pass
    return ZOO_DEFAULT_METHOD

"""The early-exit drafter's option (drafters/early_exit.py): how many of the target's layers draft."""
from __future__ import annotations

from dataclasses import dataclass

from .declare import option


@dataclass(frozen=True)
class EarlyExitOptions:
    early_exit_layers: int = option(1, "--early-exit-layers", "Layers of the target used as the draft.")

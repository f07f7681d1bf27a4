"""model_tree's option (drafters/model_tree.py): the shape of the draft model's token tree, Medusa-style paths of
child ranks, given on the command line as JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..errors import DraftVerifyError
from .declare import option
from .methods import register_method


def parse_tree_paths(value: str) -> list[tuple[int, ...]]:
    """--tree-paths as JSON, e.g. '[[0], [1], [0, 0]]'."""
    try:
        paths = json.loads(value)
    except json.JSONDecodeError as err:
        raise DraftVerifyError(f"--tree-paths must be JSON like '[[0], [1], [0, 0]]': {err}") from None
    if not isinstance(paths, list) or not all(isinstance(p, list) for p in paths):
        raise DraftVerifyError(f"--tree-paths must be a JSON list of lists of child ranks, got {value!r}")
    return [tuple(p) for p in paths]


@dataclass(frozen=True)
class TreeOptions:
    tree_paths: list[tuple[int, ...]] | None = option(
        None,
        "--tree-paths",
        "Tree shape as JSON paths of child ranks, e.g. '[[0],[1],[0,0]]' (default: the drafter's).",
        parse=parse_tree_paths,
    )


register_method(
    "model_tree",
    "draftverify.drafters.model_tree:ModelTreeDrafter",
    "the draft model's top-k expansion as a static token tree, verified at once",
    (TreeOptions,),
    needs_draft=True,
)

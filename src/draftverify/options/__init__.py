"""Method declarations and options, declared once. Each module here declares a drafter family: its options (frozen
dataclasses whose fields say their default, flag, help and the zoo file that fills them, declare.option) and one
registry.register_methods call naming its drafter class, its options and its methods. `generate`, `serve`,
`bench` and load() build their flags, zoo look-ups, checks and method lists from them. Nothing here imports torch:
the CLI reads it for --help.

A built-in family is one module here plus one import line below; a plug-in is one module plus one entry point
(registry.load_plugins).
"""

from __future__ import annotations

from ..registry import load_plugins

# the registration order is the order of `draftverify methods`, of the help's method lists and of the bench's rows
# isort: off
from . import autoregressive, model, prompt_lookup, ngram, early_exit, model_tree, blockwise  # noqa: F401
from . import bita, nat, eagle3, suffix, earn  # noqa: F401

# isort: on
from .bita import BitaOptions, BitaTreeOptions
from .blockwise import (
    HeadsOptions,
    LatticeOptions,
    NeuralRescoreOptions,
    NgramRescoreOptions,
    PBestOptions,
)
from .declare import Option, option
from .early_exit import EarlyExitOptions
from .earn import EarnOptions
from .model_tree import TreeOptions
from .nat import NATOptions
from .ngram import NgramOptions
from .prompt_lookup import (
    LookupModelOptions,
    LookupNgramOptions,
    LookupTreeOptions,
    PromptLookupOptions,
)
from .shared import SharedOptions
from .suffix import SuffixOptions
from .union import (
    MethodOptions,
    all_fields,
    check_files,
    check_names,
    defaults,
    drafter_fields,
    drafters_reading,
    fill_from_zoo,
    option_classes,
    parse_values,
    zoo_files,
)

load_plugins()

__all__ = [
    "BitaOptions",
    "BitaTreeOptions",
    "EarlyExitOptions",
    "EarnOptions",
    "HeadsOptions",
    "LatticeOptions",
    "LookupModelOptions",
    "LookupNgramOptions",
    "LookupTreeOptions",
    "MethodOptions",
    "NATOptions",
    "NeuralRescoreOptions",
    "NgramOptions",
    "NgramRescoreOptions",
    "Option",
    "PBestOptions",
    "PromptLookupOptions",
    "SharedOptions",
    "SuffixOptions",
    "TreeOptions",
    "all_fields",
    "check_files",
    "check_names",
    "defaults",
    "drafter_fields",
    "drafters_reading",
    "fill_from_zoo",
    "option",
    "option_classes",
    "parse_values",
    "zoo_files",
]

"""Method options, declared once. Each drafter's options are a frozen dataclass whose fields say their default,
flag, help and the zoo file that fills them (declare.option); `generate`, `serve`, `bench` and load() build their
flags, zoo look-ups and checks from them. Nothing here imports torch: the CLI reads it for --help.

A drafter with options of its own adds its declaration module here and one line below (register_options).
"""
from __future__ import annotations

from ..registry import register_options
from .declare import Option, option
from .nat import NATOptions
from .shared import SharedOptions
from .union import (MethodOptions, all_fields, check_files, check_names, defaults, drafter_fields, drafters_reading,
                    fill_from_zoo, option_classes, parse_values, zoo_files)

# drafter -> the options it reads: one line per drafter with options of its own
register_options("nat", NATOptions)

__all__ = ["MethodOptions", "NATOptions", "Option", "SharedOptions", "all_fields", "check_files", "check_names", "defaults",
           "drafter_fields", "drafters_reading", "fill_from_zoo", "option", "option_classes", "parse_values",
           "register_options", "zoo_files"]

"""Method options, declared once. Each drafter's options are a frozen dataclass whose fields say their default,
flag, help and the zoo file that fills them (declare.option); `generate`, `serve`, `bench` and load() build their
flags, zoo look-ups and checks from them. Nothing here imports torch: the CLI reads it for --help.

A drafter with options of its own adds its declaration module here and one line below (register_options).
"""
from __future__ import annotations

from ..registry import register_options
from .bita import BitaOptions, BitaTreeOptions
from .blockwise import HeadsOptions, LatticeOptions, NeuralRescoreOptions, NgramRescoreOptions, PBestOptions
from .declare import Option, option
from .early_exit import EarlyExitOptions
from .model_tree import TreeOptions
from .nat import NATOptions
from .ngram import NgramOptions
from .prompt_lookup import LookupModelOptions, LookupNgramOptions, LookupTreeOptions, PromptLookupOptions
from .shared import SharedOptions
from .union import (MethodOptions, all_fields, check_files, check_names, defaults, drafter_fields, drafters_reading,
                    fill_from_zoo, option_classes, parse_values, zoo_files)

# drafter -> the options it reads: one line per drafter with options of its own
register_options("prompt_lookup", LookupNgramOptions, PromptLookupOptions)
register_options("prompt_lookup_tree", LookupNgramOptions, PromptLookupOptions, LookupTreeOptions)
register_options("lookup_model", LookupNgramOptions, LookupModelOptions)
register_options("ngram", NgramOptions)
register_options("early_exit", EarlyExitOptions)
register_options("model_tree", TreeOptions)
register_options("bpd", HeadsOptions)
register_options("bpd_ngram", HeadsOptions, NgramOptions, LatticeOptions, NgramRescoreOptions)
register_options("bpd_pbest", HeadsOptions, NgramOptions, LatticeOptions, NgramRescoreOptions, PBestOptions)
register_options("bpd_neural", HeadsOptions, LatticeOptions, NeuralRescoreOptions)
register_options("bita", BitaOptions, BitaTreeOptions)
register_options("bita_tree", BitaOptions, BitaTreeOptions)
register_options("bita_chain", BitaOptions)
register_options("nat", NATOptions)

__all__ = ["BitaOptions", "BitaTreeOptions", "EarlyExitOptions", "HeadsOptions", "LatticeOptions", "LookupModelOptions",
           "LookupNgramOptions", "LookupTreeOptions", "MethodOptions", "NATOptions", "NeuralRescoreOptions",
           "NgramOptions", "NgramRescoreOptions", "Option", "PBestOptions", "PromptLookupOptions", "SharedOptions",
           "TreeOptions", "all_fields", "check_files", "check_names", "defaults", "drafter_fields", "drafters_reading",
           "fill_from_zoo", "option", "option_classes", "parse_values", "register_options", "zoo_files"]

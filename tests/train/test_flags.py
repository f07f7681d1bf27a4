"""The train commands' flags come from their dataclasses (a recipe's options, or train/flags.py): every flag of a
command is a field of its class with the declared default, a flag shared by several recipes is declared once
(SHARED) whatever default each recipe gives it, and the values reach the recipe's options as text paths."""

from __future__ import annotations

from collections import Counter
from dataclasses import fields
from pathlib import Path

import typer

from draftverify.options.declare import declared, default_of
from draftverify.train import flags as train_flags, shared_flags
from draftverify.train.align import AlignOptions
from draftverify.train.bita import BitaOptions
from draftverify.train.cli import train_app
from draftverify.train.eagle3 import Eagle3TrainOptions
from draftverify.train.early_exit import EarlyExitOptions
from draftverify.train.heads import HeadsOptions
from draftverify.train.lm import TrainOptions
from draftverify.train.ngram import NgramOptions
from draftverify.train.seq2seq import Seq2SeqOptions

# a recipe's options are its command's flags, less the run options it has no use for
LEFT_OUT = {
    "lm": {"dtype"},
    "early-exit": {"dtype"},
    "heads": {"eval_every_steps", "eval_minutes"},
    "eagle3": {"eval_every_steps", "eval_minutes"},
    "bita": {"eval_every_steps", "eval_minutes"},
    "seq2seq": {"batch_size", "device", "dtype"},
}
COMMANDS = {
    "tokenizer": train_flags.TokenizerFlags,
    "corpus": train_flags.CorpusFlags,
    "lm": TrainOptions,
    "early-exit": EarlyExitOptions,
    "bench": train_flags.BenchFlags,
    "ngram": NgramOptions,
    "align": AlignOptions,
    "heads": HeadsOptions,
    "bita": BitaOptions,
    "translate-tokenizer": train_flags.TranslateTokenizerFlags,
    "seq2seq": Seq2SeqOptions,
    "distill": train_flags.DistillFlags,
    "nat": train_flags.NatFlags,
    "eagle3": Eagle3TrainOptions,
}


def test_every_train_command_takes_the_fields_of_its_class_with_their_defaults():
    group = typer.main.get_command(train_app)
    assert set(group.commands) == set(COMMANDS)
    for name, cls in COMMANDS.items():
        params = {p.name: p for p in group.commands[name].params}
        assert set(params) == {f.name for f, _ in declared(cls)} - LEFT_OUT.get(name, set()), name
        for f, opt in declared(cls):
            if f.name in LEFT_OUT.get(name, set()):
                continue
            assert params[f.name].opts[0] == opt.flag.split("/")[0], (name, f.name)
            default = default_of(f)
            assert params[f.name].required == (default is ...), (name, f.name)
            if default is not ...:
                assert params[f.name].default == default, (name, f.name)


def test_a_shared_flag_is_declared_once_and_used_by_several_recipes():
    uses = Counter(f.name for cls in COMMANDS.values() for f in fields(cls) if f.name in shared_flags.SHARED)
    assert {"seed", "lr", "max_minutes", "max_steps", "threads", "out_dir", "progress", "bf16"} <= set(uses)
    assert all(count >= 2 for count in uses.values()), uses
    for cls in COMMANDS.values():
        for f, opt in declared(cls):
            if f.name in shared_flags.SHARED:
                assert opt.flag == shared_flags.SHARED[f.name][0], (cls.__name__, f.name)
    assert {default_of(f) for cls in COMMANDS.values() for f in fields(cls) if f.name == "lr"} >= {8e-4, 1e-4, 3e-2}


def test_values_are_the_recipes_options_as_text():
    flags = train_flags.DistillFlags(out=Path("o.txt"), threads=2)
    assert train_flags.values(flags, "data") == {
        "model": "zoo/translate/target",
        "out": "o.txt",
        "split": "train",
        "src_lang": "en",
        "tgt_lang": "de",
        "threads": 2,
    }

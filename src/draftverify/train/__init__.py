"""Training recipes for the project's own small code model pair.

Modules:

* :mod:`draftverify.train.corpus`    -- corpus manifest over the Python stdlib ``.py`` files
* :mod:`draftverify.train.tokenizer` -- byte-level BPE tokenizer (HF ``tokenizers``)
* :mod:`draftverify.train.settings`  -- the run options every recipe shares, TrainError, a run's helpers
* :mod:`draftverify.train.runner`    -- the run every recipe hands its model to (transformers' Trainer: budgets,
  checkpoints, resume; one process or several under torchrun)
* :mod:`draftverify.train.hf`        -- that run as a transformers ``Trainer``: arguments, loss, schedule
* :mod:`draftverify.train.callbacks` -- its budgets, stops and progress line, as Trainer callbacks
* :mod:`draftverify.train.presets`   -- model architectures of the zoo
* :mod:`draftverify.train.tokens`    -- the corpus as cached token arrays, training / held-out windows
* :mod:`draftverify.train.losses`    -- next-token losses, BiLD's early-exit averaged loss
* :mod:`draftverify.train.export`    -- fp16 export with tokenizer and model card
* :mod:`draftverify.train.lm`        -- recipe: from-scratch ``LlamaForCausalLM`` training (card: ``lm_card``)
* :mod:`draftverify.train.align`     -- recipe: BiLD prediction alignment of a draft
* :mod:`draftverify.train.early_exit` -- recipe: BiLD early-exit fine-tune of a target
* :mod:`draftverify.train.ngram`     -- the n-gram drafter's table
* :mod:`draftverify.train.cli`       -- ``train_app`` Typer app (``draftverify train ...``)

Heavy dependencies (torch, transformers) are only imported by the modules that
need them, so ``import draftverify.train`` stays cheap.
"""

__all__ = [
    "corpus",
    "tokenizer",
    "settings",
    "runner",
    "hf",
    "callbacks",
    "presets",
    "tokens",
    "losses",
    "export",
    "lm",
    "align",
    "early_exit",
    "ngram",
    "cli",
]

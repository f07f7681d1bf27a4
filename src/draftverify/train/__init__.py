"""Training recipes for the project's own small code model pair.

Modules:

* :mod:`draftverify.train.corpus`    -- corpus manifest over the Python stdlib ``.py`` files
* :mod:`draftverify.train.tokenizer` -- byte-level BPE tokenizer (HF ``tokenizers``)
* :mod:`draftverify.train.lm`        -- from-scratch ``LlamaForCausalLM`` training / export
* :mod:`draftverify.train.cli`       -- ``train_app`` Typer app (``draftverify train ...``)

Heavy dependencies (torch, transformers) are only imported by the modules that
need them, so ``import draftverify.train`` stays cheap.
"""

__all__ = ["corpus", "tokenizer", "lm", "cli"]

"""The drafters: what proposes the tokens the target verifies, one module per family, and every drafter class
importable from here for building a method by hand (`from draftverify.drafters import ModelDrafter`).

Importing this package registers nothing. A method is declared, and so registered, in its family's module of
options/ (one register_methods call naming its drafter class as "module:Class", imported on first use), which
methods.py, api.py and the CLI import; this package imports every drafter module (and so torch and transformers).

Drafters (module: classes, and the methods built on them)
- base.py: Drafter (the interface the loop calls: propose, then commit), NoDrafter (autoregressive)
- model.py: ModelDrafter (model, bild): a small LM drafts a chain with its own KV cache; where its positions come
  from (one forward per token, or staged with prompt lookup) in draft_positions.py, when it stops in draft_stops.py
- cross_tokenizer.py: CrossTokenizerDrafter (cross_tokenizer): a draft LM with its own tokenizer
- early_exit.py: EarlyExitDrafter (early_exit, bild_early_exit): the target's first layers draft
- model_tree.py: ModelTreeDrafter (model_tree): a draft LM expands a token tree
- prompt_lookup.py: PromptLookupDrafter (prompt_lookup): copy the continuation of an earlier match
- prompt_lookup_tree.py: PromptLookupTreeDrafter (prompt_lookup_tree): several matches merged into one tree
- lookup_model.py: LookupModelDrafter (lookup_model): prompt lookup, else the draft LM
- ngram.py: NgramDrafter, NgramTable (ngram): an n-gram table with real probabilities
- suffix.py: SuffixDrafter (suffix): the longest suffix match in this and earlier requests' text
- earn.py: EarnedDrafter (earn): the draft of suffix, prompt lookup or the draft LM that earns the most per second
- blockwise.py: BlockwiseDrafter, BlockwiseHeads (bpd): prediction heads on the target's hidden state
- blockwise_lattice.py: BlockwiseNgramDrafter, BlockwisePBestDrafter (bpd_ngram, bpd_pbest): the heads' lattice
  rescored by an n-gram table
- blockwise_neural.py: BlockwiseNeuralDrafter (bpd_neural): the heads' top-k rescored by a draft LM
- bita.py: BitaDrafter, BitaEfficientDrafter, BitaFullTreeDrafter (bita_chain, bita, bita_tree): the target drafts
  in its own verify pass through learned mask tokens (bita_adapter.py: BitaAdapter)
- nat.py: NatDrafter, NatDecoder (specdec): a non-autoregressive drafter
- eagle3.py: Eagle3Drafter (eagle3), Eagle3GgufDrafter (eagle3 with a GGUF head on llama.cpp: eagle3_gguf.py): a
  one-layer head on the target's features (eagle3_head.py) drafts a chain
- eagle3_tree.py: Eagle3TreeDrafter (eagle3_tree): the head expands a dynamic token tree

What they share: extra_positions.py (a target wrapped to carry BiTA's extra positions), retokenize.py (text
between two tokenizers, in bytes), lattice.py (the heads' top-k lattice and its n-gram rescoring), fingerprint.py
and weights_folder.py (trained pieces tied to their target, saved as a folder).
"""

from .base import Drafter, NoDrafter
from .bita import BitaDrafter, BitaEfficientDrafter, BitaFullTreeDrafter
from .bita_adapter import BitaAdapter
from .blockwise import BlockwiseDrafter, BlockwiseHeads
from .blockwise_lattice import BlockwiseNgramDrafter, BlockwisePBestDrafter
from .blockwise_neural import BlockwiseNeuralDrafter
from .cross_tokenizer import CrossTokenizerDrafter
from .eagle3 import Eagle3Drafter, Eagle3GgufDrafter
from .eagle3_tree import Eagle3TreeDrafter
from .early_exit import EarlyExitDrafter
from .earn import EarnedDrafter
from .lookup_model import LookupModelDrafter
from .model import ModelDrafter
from .model_tree import ModelTreeDrafter
from .nat import NatDecoder, NatDrafter
from .ngram import NgramDrafter, NgramTable
from .prompt_lookup import PromptLookupDrafter
from .prompt_lookup_tree import PromptLookupTreeDrafter
from .suffix import SuffixDrafter

__all__ = [
    "Drafter",
    "NoDrafter",
    "ModelDrafter",
    "EarlyExitDrafter",
    "PromptLookupDrafter",
    "NgramDrafter",
    "NgramTable",
    "ModelTreeDrafter",
    "PromptLookupTreeDrafter",
    "LookupModelDrafter",
    "BlockwiseDrafter",
    "BlockwiseHeads",
    "BlockwiseNgramDrafter",
    "BlockwisePBestDrafter",
    "BlockwiseNeuralDrafter",
    "BitaAdapter",
    "BitaDrafter",
    "BitaEfficientDrafter",
    "BitaFullTreeDrafter",
    "NatDrafter",
    "NatDecoder",
    "CrossTokenizerDrafter",
    "SuffixDrafter",
    "EarnedDrafter",
    "Eagle3Drafter",
    "Eagle3GgufDrafter",
    "Eagle3TreeDrafter",
]

"""Drafters propose tokens cheaply; importing this package registers them all."""

from .base import Drafter, NoDrafter
from .bita import BitaDrafter, BitaEfficientDrafter, BitaFullTreeDrafter
from .bita_adapter import BitaAdapter
from .blockwise import BlockwiseDrafter, BlockwiseHeads
from .blockwise_lattice import BlockwiseNgramDrafter, BlockwisePBestDrafter
from .blockwise_neural import BlockwiseNeuralDrafter
from .cross_tokenizer import CrossTokenizerDrafter
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
]

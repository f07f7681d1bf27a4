"""Tiny random Hugging Face models of several architectures, built from configs (no hub access).

Models are float64 so a batched forward over N+1 positions and N+1 incremental forwards agree closely
(~1e-9..5e-7: some HF eager attentions still take the softmax in float32, and rotary embeddings compute
cos / sin in float32), far below the logit gaps of these models, so greedy equivalence tests the algorithm
rather than float rounding. Value comparisons between two evaluations use `forward_atol`, which is derived from
that float32 floor and the size of the computation, so they hold on any x86 CPU (vectorised kernels round
differently on different instruction sets); token equality stays the strict exactness check.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import (
    BartConfig,
    BartForConditionalGeneration,
    GPT2Config,
    GPT2LMHeadModel,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MarianConfig,
    MarianMTModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    T5Config,
    T5ForConditionalGeneration,
)

from draftverify.draft_length import FixedGamma
from path_audit import _no_paths_outside_the_clone, pytest_configure  # noqa: F401  (the plugin's hook and fixture)

VOCAB = 96
EOS = 3


def _causal(arch: str, layers: int, seed: int, vocab: int = VOCAB):
    common = dict(vocab_size=vocab, eos_token_id=EOS, bos_token_id=1, pad_token_id=0)
    if arch == "llama":
        cfg = LlamaConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            **common,
        )
        cls = LlamaForCausalLM
    elif arch == "qwen2":
        cfg = Qwen2Config(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            **common,
        )
        cls = Qwen2ForCausalLM
    elif arch == "gpt2":
        cfg = GPT2Config(n_embd=32, n_layer=layers, n_head=4, n_positions=256, **common)
        cls = GPT2LMHeadModel
    elif arch == "gpt_neox":
        cfg = GPTNeoXConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=layers,
            num_attention_heads=4,
            max_position_embeddings=256,
            **common,
        )
        cls = GPTNeoXForCausalLM
    else:
        raise ValueError(arch)
    return cls, cfg


def _seq2seq(arch: str, layers: int):
    if arch == "t5":
        cfg = T5Config(
            vocab_size=VOCAB,
            d_model=32,
            d_kv=8,
            d_ff=64,
            num_layers=layers,
            num_decoder_layers=layers,
            num_heads=4,
            decoder_start_token_id=0,
            pad_token_id=0,
            eos_token_id=EOS,
        )
        return T5ForConditionalGeneration, cfg
    if arch == "bart":
        cfg = BartConfig(
            vocab_size=VOCAB,
            d_model=32,
            encoder_layers=layers,
            decoder_layers=layers,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            max_position_embeddings=256,
            decoder_start_token_id=2,
            pad_token_id=0,
            eos_token_id=EOS,
            bos_token_id=1,
            forced_eos_token_id=None,
        )
        return BartForConditionalGeneration, cfg
    if arch == "marian":
        cfg = MarianConfig(
            vocab_size=VOCAB,
            d_model=32,
            encoder_layers=layers,
            decoder_layers=layers,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            max_position_embeddings=256,
            decoder_start_token_id=0,
            pad_token_id=0,
            eos_token_id=EOS,
            forced_eos_token_id=None,
        )
        return MarianMTModel, cfg
    raise ValueError(arch)


CAUSAL_ARCHS = ["llama", "qwen2", "gpt2", "gpt_neox"]
SEQ2SEQ_ARCHS = ["t5", "bart", "marian"]
ALL_ARCHS = CAUSAL_ARCHS + SEQ2SEQ_ARCHS


def forward_atol(model, values: torch.Tensor) -> float:
    """Absolute tolerance for two evaluations of the same forward that split the work differently (one token at a
    time vs a block, cached vs recomputed, other padding): a few float32 roundings (the precision HF keeps for
    softmax and rotary cos / sin even in float64 models) per layer, at the magnitude of `values`. Float16 / bfloat16
    models use their own epsilon."""
    dtype = next(model.parameters()).dtype
    eps = torch.finfo(torch.float32 if dtype in (torch.float32, torch.float64) else dtype).eps
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    layers = next(
        (
            getattr(config, name)
            for name in ("num_hidden_layers", "num_layers", "layers")
            if isinstance(getattr(config, name, None), int)
        ),
        1,
    )
    scale = max(1.0, float(values.detach().abs().max()))
    return 64 * eps * (layers + 1) * scale


def build_model(arch: str, layers: int = 2, seed: int = 0, scale: float = 1.0, vocab: int = VOCAB):
    """A random model; `scale` multiplies every weight so the logits are peaked enough to give varied text; vocab:
    decoder-only models only (a smaller one makes exact distributions small enough to test by chi-square)."""
    cls, cfg = _causal(arch, layers, seed, vocab) if arch in CAUSAL_ARCHS else _seq2seq(arch, layers)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = cls(cfg).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(scale)
    return model


def perturbed_copy(model, noise: float, seed: int):
    """A draft that agrees with the target often but not always: target weights plus Gaussian noise."""
    import copy

    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * noise * (p.std() if p.numel() > 1 else 1))
    return draft


@torch.no_grad()
def reference_greedy(model, input_ids: torch.Tensor, max_new_tokens: int, eos: int | None = None) -> list[int]:
    """The target's own greedy decoding, recomputed from scratch each step (no cache, no drafting)."""
    if model.config.is_encoder_decoder:
        seq = torch.tensor([[model.config.decoder_start_token_id]])
        step = lambda s: model(input_ids=input_ids, decoder_input_ids=s).logits[0, -1]  # noqa: E731
    else:
        seq = input_ids
        step = lambda s: model(input_ids=s).logits[0, -1]  # noqa: E731
    out: list[int] = []
    for _ in range(max_new_tokens):
        token = int(step(seq).argmax())
        out.append(token)
        seq = torch.cat([seq, torch.tensor([[token]])], dim=1)
        if eos is not None and token == eos:
            break
    return out


@pytest.fixture(scope="session")
def models():
    """Cache of built models keyed by (arch, layers, seed, scale)."""
    cache: dict = {}

    def get(arch: str, layers: int = 2, seed: int = 0, scale: float = 1.0):
        key = (arch, layers, seed, scale)
        if key not in cache:
            cache[key] = build_model(arch, layers, seed, scale)
        return cache[key]

    return get


# (scale, seed) per architecture chosen so greedy text has many distinct tokens (a collapsed model that repeats
# one token would make equivalence tests vacuous); tests assert the variety before relying on it.
VARIED = {
    "llama": (2.5, 1),
    "qwen2": (1.5, 1),
    "gpt2": (2.0, 0),
    "gpt_neox": (1.5, 0),
    "t5": (5.0, 1),
    "bart": (8.0, 0),
    "marian": (1.0, 1),
}


def varied_model(arch: str, layers: int = 2):
    scale, seed = VARIED[arch]
    return build_model(arch, layers=layers, seed=seed, scale=scale)


@pytest.fixture
def float64_softmax(monkeypatch):
    """Compute every softmax of float32/float64 input in float64: HF eager attention normalises in float32, whose
    rounding depends on the key length (see tests/backends/hf/test_cache.py), so exact-position checks need this."""
    original = F.softmax

    def softmax(input, dim=None, _stacklevel=3, dtype=None):
        if input.is_floating_point() and dtype in (None, torch.float32, torch.float64):
            return original(input.double(), dim=dim)
        return original(input, dim=dim, _stacklevel=_stacklevel, dtype=dtype)

    monkeypatch.setattr(F, "softmax", softmax)


def _chi2_bins(p: torch.Tensor, draws: int) -> torch.Tensor:
    """Tokens with an expected count of at least 5 get their own bin; the rest share one."""
    return p * draws >= 5


def chi2_statistic(counts: torch.Tensor, p: torch.Tensor) -> float:
    draws = float(counts.sum())
    big = _chi2_bins(p, int(draws))
    observed = torch.cat([counts[big], counts[~big].sum()[None]])
    expected = torch.cat([p[big], p[~big].sum()[None]]) * draws
    return float(((observed - expected) ** 2 / expected.clamp_min(1e-12)).sum())


def chi2_critical(counts: torch.Tensor, p: torch.Tensor, z: float = 3.09) -> float:
    """Upper 0.001 quantile of chi-square (Wilson-Hilferty), degrees of freedom = bins - 1."""
    df = int(_chi2_bins(p, int(counts.sum())).sum())  # own bins + the shared one, minus 1
    return df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3


_REFERENCES: dict = {}


def target_and_reference(arch: str, prompt: torch.Tensor, new: int):
    """A varied tiny target of `arch` and its own greedy continuation of prompt [1, L] (new tokens), built once per
    session and shared by the drafter tests."""
    key = (arch, tuple(prompt.flatten().tolist()), new)
    if key not in _REFERENCES:
        model = varied_model(arch)
        _REFERENCES[key] = (model, reference_greedy(model, prompt, new))
    return _REFERENCES[key]


def left_padded(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of token ids of different lengths as one left-padded batch: ids [B, L] (0 at the padding) and the
    attention mask [B, L] (False there)."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[False] * (width - len(p)) + [True] * len(p) for p in prompts])
    return ids, mask


def save_llama(path: Path, layers: int, seed: int, tokenizer, context: int = 256) -> None:
    """A tiny random Llama for the zoo tokenizer, saved with it: peaked logits give varied, deterministic text."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=context,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)  # peaked logits: varied, deterministic text
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


@pytest.fixture
def code_zoo_without_nat(tmp_path, monkeypatch):
    """$DRAFTVERIFY_ZOO set to a copy of the shipped zoo (links) whose code entry lacks its NAT drafter."""
    from draftverify.zoo import ZOO_ENV, zoo_root

    root = tmp_path / "zoo"
    for entry in zoo_root().iterdir():
        if entry.name != "code":
            (root / entry.name).parent.mkdir(parents=True, exist_ok=True)
            (root / entry.name).symlink_to(entry)
            continue
        for item in entry.iterdir():
            if item.name != "nat":
                (root / "code").mkdir(parents=True, exist_ok=True)
                (root / "code" / item.name).symlink_to(item)
    monkeypatch.setenv(ZOO_ENV, str(root))
    return root


class PlainStepsBetween(FixedGamma):
    """gamma auto may choose 0 (a plain step, no proposal) between drafted steps."""

    def __init__(self):
        super().__init__(4)
        self.step = 0

    def next(self, rows: int = 1) -> int:
        self.step += 1
        return 0 if self.step % 3 == 0 else self.gamma


def tiny_gguf_pair(root: Path, tokenizer_dir: Path) -> dict:
    """A tiny random Llama target on the given tokenizer and a noisy copy of it as the draft (it agrees on about
    half the tokens), converted to GGUF: the target at f32, the draft at the llamacpp backend's default draft type."""
    import copy

    from transformers import AutoTokenizer

    from draftverify.backends import DEFAULT_DRAFT_GGUF
    from draftverify.backends.gguf import gguf_for
    from draftverify.backends.llamacpp import GGUFModel

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    save_llama(root / "target", layers=2, seed=0, tokenizer=tokenizer)
    draft = copy.deepcopy(LlamaForCausalLM.from_pretrained(root / "target"))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05 * p.std())
    draft.save_pretrained(root / "draft")
    tokenizer.save_pretrained(root / "draft")
    cache = root / "gguf"
    return {
        "root": root,
        "target": GGUFModel(gguf_for(root / "target", cache_dir=cache)),
        "draft": GGUFModel(gguf_for(root / "draft", DEFAULT_DRAFT_GGUF, cache_dir=cache)),
        "cache": cache,
    }

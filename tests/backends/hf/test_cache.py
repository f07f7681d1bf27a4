"""KV-cache rollback round trips on tiny float64 models (DynamicCache and EncoderDecoderCache).

Each test mimics the decoding loop: prefill, score the pending token plus k drafted tokens, crop back to the
committed length (keeping n accepted drafts), then score a different continuation. The logits must equal those
of a fresh CachedLM fed the same committed sequence, and those of a cache-free full forward.

Numerics: the conftest models are float64, but Hugging Face's eager attention of llama / qwen2 / gpt_neox
(`softmax(..., dtype=torch.float32)`) and t5 (`softmax(scores.float())`) normalises attention in float32, whose
reduction order depends on the key length. A prefix scored in different block shapes then differs by up to
~1e-8..5e-7 in the logits, which has nothing to do with the cache. The `float64_softmax` fixture makes that
softmax float64 for the duration of a test so the round trips can be checked at atol 1e-10; one test keeps the
stock float32 softmax and checks the same round trip at float32-softmax precision.
"""

from __future__ import annotations

import pytest
import torch

from conftest import SEQ2SEQ_ARCHS, VOCAB
from draftverify.backends.hf.cache import cache_length, gather_positions, keep_positions, new_cache
from draftverify.backends.hf.cached_lm import CachedLM
from draftverify.errors import DraftVerifyError

torch.set_num_threads(1)

ATOL = 1e-10
DECODER_ONLY = ["llama", "gpt2", "gpt_neox", "qwen2"]
ENC_DEC = ["t5", "bart"]
ALL = DECODER_ONLY + ENC_DEC


def _prompt(arch: str, gen: torch.Generator, length: int = 6) -> torch.Tensor:
    return torch.randint(4, VOCAB, (1, length), generator=gen)


def _fresh_logits(model, arch: str, prompt: torch.Tensor, committed: torch.Tensor, cont: torch.Tensor) -> torch.Tensor:
    """A new CachedLM holding `committed` (all but its last token cached), then scoring last + cont."""
    lm = CachedLM(model)
    if arch in SEQ2SEQ_ARCHS:
        start = lm.start(prompt)
        assert torch.equal(start, committed[:, :1])
        if committed.shape[1] > 1:
            lm.forward(committed[:, :-1])
    else:
        assert torch.equal(lm.start(committed), committed)
    assert lm.length == committed.shape[1] - 1
    return lm.forward(torch.cat([committed[:, -1:], cont], dim=1)).logits


@torch.no_grad()
def _full_logits(model, arch: str, prompt: torch.Tensor, sequence: torch.Tensor, last: int) -> torch.Tensor:
    """Cache-free logits of the last `last` positions of the decoder-side `sequence`."""
    if arch in SEQ2SEQ_ARCHS:
        out = model(input_ids=prompt, decoder_input_ids=sequence, use_cache=False)
    else:
        out = model(input_ids=sequence, use_cache=False)
    return out.logits[:, -last:]


def _step(lm: CachedLM, committed: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
    cached = lm.length
    assert cached == committed.shape[1] - 1  # the CachedLM invariant
    logits = lm.forward(torch.cat([committed[:, cached:], draft], dim=1)).logits
    assert logits.shape == (1, 1 + draft.shape[1], VOCAB)
    assert lm.length == committed.shape[1] + draft.shape[1]
    return logits


@pytest.mark.parametrize("accepted", [0, 2, 4], ids=["none", "some", "all"])
@pytest.mark.parametrize("arch", ALL)
def test_rollback_round_trip(models, float64_softmax, arch, accepted):
    model = models(arch, layers=2, seed=0)
    gen = torch.Generator().manual_seed(10 * ALL.index(arch) + accepted)
    k = 4
    prompt = _prompt(arch, gen)
    lm = CachedLM(model)
    committed = lm.start(prompt)
    assert lm.is_encoder_decoder == (arch in SEQ2SEQ_ARCHS)

    draft = torch.randint(4, VOCAB, (1, k), generator=gen)
    logits = _step(lm, committed, draft)
    next_token = logits[:, accepted].argmax(-1, keepdim=True)  # the target's token after the accepted prefix
    held = lm.length
    lm.commit(1 + accepted)  # keep the pending token and the accepted drafts
    assert cache_length(lm.cache) == lm.length  # our counter and the cache agree
    if accepted == k:
        assert lm.length == held  # everything accepted: nothing dropped
    committed = torch.cat([committed, draft[:, :accepted], next_token], dim=1)
    assert lm.length == committed.shape[1] - 1

    # a different continuation from the rolled-back cache
    cont = (draft + 1 + torch.arange(k)) % (VOCAB - 4) + 4
    got = _step(lm, committed, cont)
    torch.testing.assert_close(got, _fresh_logits(model, arch, prompt, committed, cont), rtol=0, atol=ATOL)
    full = _full_logits(model, arch, prompt, torch.cat([committed, cont], dim=1), k + 1)
    torch.testing.assert_close(got, full, rtol=0, atol=ATOL)


@pytest.mark.parametrize("arch", ALL)
def test_many_rollbacks_match_cache_free_forward(models, float64_softmax, arch):
    """Several loop steps with random accepted lengths; every step's logits equal a cache-free forward."""
    model = models(arch, layers=2, seed=1)
    gen = torch.Generator().manual_seed(7)
    prompt = _prompt(arch, gen, length=5)
    lm = CachedLM(model)
    committed = lm.start(prompt)
    for step in range(10):  # reaches ~30 decoder positions
        k = int(torch.randint(1, 5, (1,), generator=gen))
        draft = torch.randint(4, VOCAB, (1, k), generator=gen)
        logits = _step(lm, committed, draft)
        full = _full_logits(model, arch, prompt, torch.cat([committed, draft], dim=1), k + 1)
        torch.testing.assert_close(logits, full, rtol=0, atol=ATOL)
        accepted = int(torch.randint(0, k + 1, (1,), generator=gen))
        next_token = torch.randint(4, VOCAB, (1, 1), generator=gen)
        lm.commit(1 + accepted)
        committed = torch.cat([committed, draft[:, :accepted], next_token], dim=1)
    assert lm.length == committed.shape[1] - 1


@pytest.mark.parametrize("arch", ["llama", "t5"])
def test_rollback_with_stock_float32_softmax(models, arch):
    """Without the float64 softmax the same round trip agrees to float32-softmax precision (and no worse)."""
    model = models(arch, layers=2, seed=1)
    gen = torch.Generator().manual_seed(7)
    prompt = _prompt(arch, gen, length=5)
    lm = CachedLM(model)
    committed = lm.start(prompt)
    for step in range(10):
        k = int(torch.randint(1, 5, (1,), generator=gen))
        draft = torch.randint(4, VOCAB, (1, k), generator=gen)
        logits = _step(lm, committed, draft)
        full = _full_logits(model, arch, prompt, torch.cat([committed, draft], dim=1), k + 1)
        torch.testing.assert_close(logits, full, rtol=0, atol=1e-5)
        accepted = int(torch.randint(0, k + 1, (1,), generator=gen))
        lm.commit(1 + accepted)
        committed = torch.cat([committed, draft[:, :accepted], logits[:, accepted].argmax(-1, keepdim=True)], dim=1)


@pytest.mark.parametrize("arch", ALL)
def test_commit_beyond_the_tail_raises(models, arch):
    lm = CachedLM(models(arch, layers=1, seed=2))
    gen = torch.Generator().manual_seed(3)
    committed = lm.start(_prompt(arch, gen))
    lm.forward(torch.cat([committed[:, lm.length :], torch.randint(4, VOCAB, (1, 3), generator=gen)], dim=1))
    held = lm.length
    with pytest.raises(DraftVerifyError):
        lm.commit(held - lm.committed + 1)
    with pytest.raises(DraftVerifyError):
        lm.commit(-1)
    with pytest.raises(DraftVerifyError):
        lm.commit(torch.zeros(1, held - lm.committed + 1, dtype=torch.long))
    assert lm.length == held  # a refused commit leaves the cache alone
    assert cache_length(lm.cache) == held
    lm.commit(held - lm.committed)
    assert lm.length == lm.committed == held


@pytest.mark.parametrize("arch", ALL)
def test_commit_nothing_then_rescore(models, float64_softmax, arch):
    model = models(arch, layers=1, seed=4)
    gen = torch.Generator().manual_seed(5)
    prompt = _prompt(arch, gen)
    lm = CachedLM(model)
    committed = lm.start(prompt)
    settled = lm.length
    seq = torch.cat([committed, torch.randint(4, VOCAB, (1, 3), generator=gen)], dim=1)
    lm.forward(seq[:, settled:])
    lm.commit(0)
    assert lm.length == settled == cache_length(lm.cache)
    got = lm.forward(seq[:, settled:]).logits
    full = _full_logits(model, arch, prompt, seq, seq.shape[1] - settled)
    torch.testing.assert_close(got, full, rtol=0, atol=ATOL)


@pytest.mark.parametrize("arch", ENC_DEC)
def test_encoder_decoder_commit_keeps_cross_attention(models, arch):
    lm = CachedLM(models(arch, layers=1, seed=6))
    gen = torch.Generator().manual_seed(8)
    source = _prompt(arch, gen, length=7)
    committed = lm.start(source)
    lm.forward(torch.cat([committed, torch.randint(4, VOCAB, (1, 4), generator=gen)], dim=1))
    cross_before = lm.cache.cross_attention_cache.get_seq_length()
    assert cross_before == source.shape[1]
    lm.commit(2)
    assert lm.length == 2
    assert lm.cache.self_attention_cache.get_seq_length() == 2
    assert lm.cache.cross_attention_cache.get_seq_length() == cross_before


def test_keep_and_gather_positions_on_raw_caches():
    for is_enc_dec in (False, True):
        cache = new_cache(is_enc_dec)
        assert cache_length(cache) == 0
        keep_positions(cache, 0, 0)  # no-op on an empty cache
        with pytest.raises(DraftVerifyError):
            keep_positions(cache, 1, 0)
        with pytest.raises(DraftVerifyError):
            keep_positions(cache, -1, 0)
    cache = new_cache(False)
    k = torch.arange(5, dtype=torch.float64).reshape(1, 1, 5, 1).expand(1, 2, 5, 4).contiguous()
    cache.update(k, k + 10, layer_idx=0)
    keep_positions(cache, 4, 5)
    assert cache_length(cache) == 4
    with pytest.raises(DraftVerifyError):
        keep_positions(cache, 5, 4)
    gather_positions(cache, 1, torch.tensor([2, 0]), 4)  # keep position 0, then 3, then 1
    assert cache.layers[0].keys[0, 0, :, 0].tolist() == [0.0, 3.0, 1.0]
    assert cache.layers[0].values[0, 1, :, 3].tolist() == [10.0, 13.0, 11.0]

"""llama.cpp's own layer-input extraction (what its draft-eagle3 reads), as the eagle3 method's wrapper takes it:
the same features as the Hugging Face model's, position for position, through the deferred prompt (decoded with
the first step) and a verify pass; the token embedding and LM head read from the GGUF file; and the head's chains
and trees keep llama.cpp's greedy text."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("llama_cpp", reason="the llamacpp extra is not installed")

from transformers import AutoTokenizer, LlamaForCausalLM  # noqa: E402

from conftest import left_padded, save_llama  # noqa: E402
from draftverify import RowRequest, SamplingParams, generate  # noqa: E402
from draftverify.backends.gguf import converter_available, gguf_for  # noqa: E402
from draftverify.backends.llamacpp import LlamaCppLM  # noqa: E402
from draftverify.drafters.base import NoDrafter  # noqa: E402
from draftverify.drafters.eagle3 import Eagle3Drafter, LayerInputsTarget  # noqa: E402
from draftverify.drafters.eagle3_tree import Eagle3TreeDrafter  # noqa: E402
from draftverify.errors import DraftVerifyError  # noqa: E402
from draftverify.methods import MethodOptions, build_verifier  # noqa: E402
from eagle3_heads import trained_head  # noqa: E402

pytestmark = pytest.mark.skipif(
    not converter_available(), reason="no llama.cpp converter: scripts/fetch_llama_cpp_converter.sh"
)

PROMPT = [5, 17, 99, 230, 7, 5, 17, 99, 230, 7]
LAYERS = (0, 1, 3)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, request):
    root = tmp_path_factory.mktemp("layer-inputs")
    tokenizer = AutoTokenizer.from_pretrained(request.config.rootpath / "zoo" / "code" / "tokenizer")
    save_llama(root / "target", layers=4, seed=3, tokenizer=tokenizer)
    model = LlamaForCausalLM.from_pretrained(root / "target").float().eval()
    return model, gguf_for(root / "target", cache_dir=root / "gguf")


def test_the_llama_cpp_features_are_the_hugging_face_models(tiny):
    model, path = tiny
    target = LayerInputsTarget.of(LlamaCppLM(path, threads=1), LAYERS)
    target.start(torch.tensor([PROMPT[:7]]), want_hidden=True)
    assert target.prefilled is None  # the prompt stays deferred: decoded in one piece with the first step
    out = target.forward(torch.tensor([PROMPT[6:]]), want_hidden=True)
    with torch.no_grad():
        full = model(torch.tensor([PROMPT]), output_hidden_states=True)
    expected = torch.cat([full.hidden_states[i] for i in LAYERS], dim=-1)  # [1, 10, 3H]
    assert target.earlier.shape == (1, 6, expected.shape[-1])  # the prompt's positions, before the scored ones
    # float32 both, summed in other orders (llama.cpp's flash attention): equal to a small fraction of their scale
    scale = float(expected.abs().max())
    assert float((target.earlier - expected[:, :6]).abs().max()) < 5e-3 * scale
    assert float((out.hidden - expected[:, 6:]).abs().max()) < 5e-3 * scale
    # the weights the head reads through: the GGUF's own, equal to the model's (f32 file)
    assert torch.equal(target.embedding.weight, model.get_input_embeddings().weight)
    assert torch.equal(target.lm_head.weight, model.get_output_embeddings().weight) and target.exact_weights


def test_layers_the_target_lacks_are_refused(tiny):
    _, path = tiny
    with pytest.raises(DraftVerifyError, match="has 4 layers"):
        LayerInputsTarget.of(LlamaCppLM(path, threads=1), (0, 1, 9))


@pytest.mark.parametrize("method", ["eagle3", "eagle3_tree"])
def test_eagle3_chains_and_trees_give_llama_cpps_greedy_text(tiny, method):
    """The head's drafts, chains and dynamic trees (verified with the tree's mask in llama.cpp), keep the text
    llama.cpp's own greedy decoding gives."""
    model, path = tiny
    verifier = build_verifier("exact", SamplingParams(), MethodOptions())
    prompt = torch.tensor([PROMPT])
    plain = generate(LlamaCppLM(path, threads=1), NoDrafter(), verifier, prompt, max_new_tokens=24)
    # fitted on llama.cpp's own text (this random target's greedy text parts from the Hugging Face model's)
    text = PROMPT + plain.new_tokens[0].tolist()
    head = trained_head(copy.deepcopy(model).double(), [text], 1, steps=60, aux_layers=LAYERS)
    drafter = Eagle3TreeDrafter(head, top_k=3, nodes=12) if method == "eagle3_tree" else Eagle3Drafter(head)
    out = generate(LlamaCppLM(path, threads=1), drafter, verifier, prompt, max_new_tokens=24, gamma=3)
    assert out.new_tokens.tolist() == plain.new_tokens.tolist()
    assert out.stats.accepted_tokens > 6  # the head's drafts were kept, the tree's at their branch's positions


def test_a_request_after_an_eagle3_one_on_the_same_context_extracts_nothing(tiny):
    """Extraction is asked for per request: after an eagle3 generation, a plain one on the same backend keeps no
    layer inputs (llama.cpp's extraction is off for it), and the next eagle3 generation asks again and keeps its
    text."""
    model, path = tiny
    verifier = build_verifier("exact", SamplingParams(), MethodOptions())
    prompt = torch.tensor([PROMPT])
    lm = LlamaCppLM(path, threads=1)
    plain = generate(lm, NoDrafter(), verifier, prompt, max_new_tokens=16)
    head = trained_head(
        copy.deepcopy(model).double(), [PROMPT + plain.new_tokens[0].tolist()], 1, steps=30, aux_layers=LAYERS
    )
    first = generate(lm, Eagle3Drafter(head), verifier, prompt, max_new_tokens=16, gamma=3)
    assert lm.layer_inputs == LAYERS  # the eagle3 request extracted
    again = generate(lm, NoDrafter(), verifier, prompt, max_new_tokens=16)
    assert lm.layer_inputs == () and lm.take_layer_inputs().shape[0] == 0  # the plain one did not
    second = generate(lm, Eagle3Drafter(head), verifier, prompt, max_new_tokens=16, gamma=3)
    assert lm.layer_inputs == LAYERS
    assert (
        first.new_tokens.tolist()
        == again.new_tokens.tolist()
        == second.new_tokens.tolist()
        == plain.new_tokens.tolist()
    )
    assert second.stats.accepted_tokens == first.stats.accepted_tokens  # the same drafts: features read again


ROWS = [PROMPT, [7, 230, 99, 17], [5, 17, 99, 230, 7, 5], [42, 8, 5, 17, 99, 230, 7, 5, 17]]


@pytest.fixture(scope="module")
def fitted_rows(tiny):
    """A head fitted to llama.cpp's greedy texts of ROWS, and those texts."""
    model, path = tiny
    verifier = build_verifier("exact", SamplingParams(), MethodOptions())
    texts = [
        generate(LlamaCppLM(path, threads=1), NoDrafter(), verifier, torch.tensor([p]), max_new_tokens=24).rows[0]
        for p in ROWS
    ]
    head = trained_head(
        copy.deepcopy(model).double(), [p + t for p, t in zip(ROWS, texts)], 1, steps=60, aux_layers=LAYERS
    )
    return path, head, texts, verifier


def test_eagle3_rows_on_llama_cpp_equal_their_batch_1_texts(fitted_rows):
    """Rows on one llama.cpp context (each its own sequence): the wrapper hands each row its own features (its
    prompt's, decoded with the first step, and its scored columns'), so every row keeps its llama.cpp text and the
    head's drafts are accepted; at a fixed length each row accepts what it accepts alone."""
    path, head, texts, verifier = fitted_rows
    limits = [24, 20, 24, 9]
    ids, mask = left_padded(ROWS)
    out = generate(
        LlamaCppLM(path, threads=1),
        Eagle3Drafter(head),
        verifier,
        ids,
        attention_mask=mask,
        max_new_tokens=limits,
        gamma=3,
    )
    assert out.rows == [t[:n] for t, n in zip(texts, limits)]
    alone = [
        generate(
            LlamaCppLM(path, threads=1), Eagle3Drafter(head), verifier, torch.tensor([p]), max_new_tokens=n, gamma=3
        )
        for p, n in zip(ROWS, limits)
    ]
    assert out.stats.accepted_tokens > 10
    assert out.stats.accepted_tokens == sum(a.stats.accepted_tokens for a in alone)


def test_eagle3_rows_joining_on_llama_cpp_keep_their_texts(fitted_rows):
    """Continuous batching on llama.cpp: a joining row's prompt is decoded with a later step (its features are not
    used: it drafts from what it decodes after, as on the hf backend)."""
    path, head, texts, verifier = fitted_rows
    schedule = {2: [1, 2], 4: [3]}
    calls = []

    def admit():
        calls.append(len(calls) + 1)
        return [RowRequest(ROWS[i], 24) for i in schedule.get(len(calls), [])]

    out = generate(
        LlamaCppLM(path, threads=1),
        Eagle3Drafter(head),
        verifier,
        torch.tensor([ROWS[0]]),
        max_new_tokens=24,
        gamma=3,
        admit=admit,
    )
    assert out.rows == texts and out.stats.accepted_tokens > 0

"""eagle3 with the head as its GGUF file, run by llama.cpp beside a llama.cpp target: it computes what the torch head
computes (g, prenorm states, logits, through several pairs fed in one call), drafts what the torch head drafts, keeps
llama.cpp's greedy text, and refuses what it cannot run with one line."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("llama_cpp", reason="the llamacpp extra is not installed")

from transformers import AutoTokenizer, LlamaForCausalLM  # noqa: E402

from conftest import save_llama  # noqa: E402
from draftverify import SamplingParams, generate, load  # noqa: E402
from draftverify.backends.gguf import converter_available, gguf_for  # noqa: E402
from draftverify.backends.llamacpp import LlamaCppLM  # noqa: E402
from draftverify.drafters.base import NoDrafter  # noqa: E402
from draftverify.drafters.eagle3 import Eagle3Drafter, Eagle3GgufDrafter  # noqa: E402
from draftverify.drafters.eagle3_gguf import LlamaCppEagle3Head  # noqa: E402
from draftverify.drafters.eagle3_head import Eagle3Head, HeadCache  # noqa: E402
from draftverify.errors import DraftVerifyError  # noqa: E402
from draftverify.methods import MethodOptions, build_drafter  # noqa: E402
from eagle3_heads import exact, trained_head  # noqa: E402

pytestmark = pytest.mark.skipif(
    not converter_available(), reason="no llama.cpp converter: scripts/fetch_llama_cpp_converter.sh"
)

PROMPT = [5, 17, 99, 230, 7, 5, 17, 99, 230, 7]
LAYERS = (0, 1, 3)
NEW = 24


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, request):
    """A 4-layer target (folder and f32 GGUF), a head fitted to llama.cpp's greedy text of it (folder and f32
    GGUF), and that text."""
    root = tmp_path_factory.mktemp("eagle3-gguf")
    tokenizer = AutoTokenizer.from_pretrained(request.config.rootpath / "zoo" / "code" / "tokenizer")
    save_llama(root / "target", layers=4, seed=3, tokenizer=tokenizer)
    model = LlamaForCausalLM.from_pretrained(root / "target").float().eval()
    target_gguf = gguf_for(root / "target", cache_dir=root / "gguf")
    plain = generate(
        LlamaCppLM(target_gguf, threads=1), NoDrafter(), exact(), torch.tensor([PROMPT]), max_new_tokens=NEW
    )
    text = PROMPT + plain.new_tokens[0].tolist()
    trained_head(copy.deepcopy(model).double(), [text], 1, steps=60, aux_layers=LAYERS).save(root / "head")
    head_gguf = gguf_for(root / "head", "f32", cache_dir=root / "gguf", target_dir=root / "target")
    return root, target_gguf, head_gguf, plain.new_tokens[0].tolist()


def test_the_gguf_head_computes_what_the_torch_head_does(tiny):
    root, target_gguf, head_gguf, _ = tiny
    torch_head = Eagle3Head.load(root / "head").eval()
    embedding = LlamaForCausalLM.from_pretrained(root / "target").float().eval()
    embed, lm_head = embedding.get_input_embeddings(), embedding.get_output_embeddings()
    head = LlamaCppEagle3Head(head_gguf)
    head.attach(LlamaCppLM(target_gguf, threads=1), 64, 1)
    assert head.aux_layers == LAYERS
    torch.manual_seed(0)
    features = torch.randn(6, 3 * torch_head.config.hidden_size)  # [m, 3H]
    tokens = torch.tensor([[5, 17, 99, 3, 42, 8]])  # [1, m]
    with torch.no_grad():
        g = torch_head.fc(features)  # [m, H]
        cache = HeadCache()
        prenorm = torch_head.step(cache, embed(tokens), g[None], torch.arange(6)[None])  # [1, m, H]
        logits = torch_head.logits(prenorm, lm_head)  # [1, m, V]
        # one more pair, the way a draft goes on: the last state stands in for g at the next position
        following = torch_head.step(cache, embed(torch.tensor([[11]])), prenorm[:, -1:], torch.tensor([[6]]))
        following_logits = torch_head.logits(following, lm_head)
    scale = float(prenorm.abs().max())

    def close(a: torch.Tensor, b: torch.Tensor) -> bool:
        return float((a - b).abs().max()) < 2e-3 * max(scale, float(b.abs().max()))

    g_ours = head.encode(features)
    assert close(g_ours, g)
    state, state_logits = head.decode(tokens[0].tolist(), g_ours, 0)  # six pairs in one call: the last one's
    assert close(state, prenorm[0, -1]) and close(state_logits, logits[0, -1])
    assert int(state_logits.argmax()) == int(logits[0, -1].argmax())
    state_before = state
    state, state_logits = head.decode([11], state[None], 6)
    assert close(state, following[0, -1]) and close(state_logits, following_logits[0, -1])
    head.truncate(6)  # the drafted pair leaves; the same pair fed again gives the same state
    again, _ = head.decode([11], state_before[None], 6)
    assert close(again, following[0, -1])
    # a prompt's many pairs (more than one call takes with every pair an output): the last one's, still
    many = torch.randn(40, 3 * torch_head.config.hidden_size)  # [40, 3H]
    many_tokens = torch.randint(0, lm_head.weight.shape[0], (1, 40))
    with torch.no_grad():
        expected = torch_head.step(HeadCache(), embed(many_tokens), torch_head.fc(many)[None], torch.arange(40)[None])
        expected_logits = torch_head.logits(expected[:, -1], lm_head)[0]
    head.clear()
    state, state_logits = head.decode(many_tokens[0].tolist(), head.encode(many), 0)
    assert close(state, expected[0, -1]) and close(state_logits, expected_logits)


def test_eagle3_with_the_gguf_head_keeps_llama_cpps_greedy_text_and_drafts_as_the_torch_head(tiny):
    root, target_gguf, head_gguf, plain = tiny
    prompt = torch.tensor([PROMPT])
    runs = {}
    for name, drafter in (
        ("torch", Eagle3Drafter(Eagle3Head.load(root / "head"))),
        ("gguf", Eagle3GgufDrafter(head_gguf)),
    ):
        out = generate(LlamaCppLM(target_gguf, threads=1), drafter, exact(), prompt, max_new_tokens=NEW, gamma=3)
        assert out.new_tokens[0].tolist() == plain, name
        runs[name] = out.stats
    assert runs["gguf"].accepted_tokens > 6  # the head's drafts were kept
    assert abs(runs["gguf"].accepted_tokens - runs["torch"].accepted_tokens) <= 2  # the same head, rounded apart
    # the drafter serves request after request: the head's cache starts empty each time
    again = generate(
        LlamaCppLM(target_gguf, threads=1), Eagle3GgufDrafter(head_gguf), exact(), prompt, max_new_tokens=NEW, gamma=5
    )
    assert again.new_tokens[0].tolist() == plain


def test_load_runs_a_gguf_head_and_sampling_is_reproducible(tiny):
    root, target_gguf, head_gguf, plain = tiny
    pipe = load(target=target_gguf, method="eagle3", backend="llamacpp", eagle3_path=head_gguf, gamma=4)
    assert isinstance(pipe.drafter, Eagle3GgufDrafter)
    prompt = torch.tensor([PROMPT])
    for _ in range(2):  # one loaded pipeline, two requests
        assert pipe.generate_ids(prompt, SamplingParams(), NEW)[0].new_tokens[0].tolist() == plain
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=7)
    texts = [pipe.generate_ids(prompt, params, NEW)[0].new_tokens for _ in range(2)]
    assert torch.equal(texts[0], texts[1]) and int(texts[0].max()) < pipe.target.vocab_size


def test_what_a_gguf_head_cannot_run_is_refused_in_one_line(tiny, tmp_path):
    root, target_gguf, head_gguf, _ = tiny
    with pytest.raises(DraftVerifyError, match="runs the head in torch"):
        build_drafter("eagle3_tree", None, MethodOptions(eagle3_path=head_gguf))
    with pytest.raises(DraftVerifyError, match="no such GGUF file"):
        build_drafter("eagle3", None, MethodOptions(eagle3_path=tmp_path / "absent.gguf"))
    with pytest.raises(DraftVerifyError, match="not an EAGLE-3 head"):
        Eagle3GgufDrafter(target_gguf)
    with pytest.raises(DraftVerifyError, match="--backend llamacpp"):
        load(target=root / "target", method="eagle3", eagle3_path=head_gguf).generate_ids(
            torch.tensor([PROMPT]), SamplingParams(), 4
        )
    tokenizer = AutoTokenizer.from_pretrained(root / "target")
    save_llama(tmp_path / "small", layers=2, seed=1, tokenizer=tokenizer)  # the head reads layer 3: absent here
    small = LlamaCppLM(gguf_for(tmp_path / "small", cache_dir=tmp_path / "gguf"), threads=1)
    with pytest.raises(DraftVerifyError, match="has 2 layers"):
        generate(small, Eagle3GgufDrafter(head_gguf), exact(), torch.tensor([PROMPT]), max_new_tokens=4)

"""Structured output through the loop (xgrammar): the grammar's bitmask at every verified position, the draft cut at
the first token the grammar forbids (before the target scores it), the matcher advanced by what each step emits.
Every method's text equals the target alone under the same grammar: a reference that decodes one token at a time
with xgrammar's own matcher and bitmask, on the zoo's code model (hf), and on llama.cpp."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

xgr = pytest.importorskip("xgrammar", reason="the structured extra is not installed (pip install -e '.[structured]')")

from draftverify import Processing, Structured  # noqa: E402
from draftverify.api import load  # noqa: E402
from draftverify.engine.grammar import layout, pack, unpack  # noqa: E402
from draftverify.engine.processors import Processors  # noqa: E402
from draftverify.processing import ProcessingError  # noqa: E402
from draftverify.tree import TreeSpec  # noqa: E402
from draftverify.types import DecodingState, Draft, SamplingParams  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PROMPT = '# a JSON item\nitem = {"name": "cup", "ok": true, "size": "M"}\n# another one\nitem = '
SPECS = {
    "json_schema": Structured(
        json_schema={
            "type": "object",
            "properties": {"name": {"type": "string", "pattern": "^[a-z]{1,10}$"}, "size": {"enum": ["S", "M", "L"]}},
            "required": ["name", "size"],
        }
    ),
    "regex": Structured(regex=r"\{\"name\": \"[a-z]+\", \"ok\": (true|false)\}"),
    "grammar": Structured(
        grammar='root ::= "{" pair (", " pair)* "}"\npair ::= "\\"" [a-z]+ "\\": " value\n'
        'value ::= "true" | "false" | "\\"" [a-zA-Z]+ "\\""'
    ),
}


@pytest.fixture(scope="module")
def zoo():
    """The zoo's code target with each method, on the hf backend (one target, several pipelines)."""
    return {method: load(zoo="code", method=method, gamma=4) for method in ("prompt_lookup", "model", "model_tree")}


@torch.no_grad()
def grammar_greedy(pipe, prompt: str, spec: Structured, new: int) -> list[int]:
    """The target alone under the grammar, one token at a time from scratch: xgrammar's matcher fills the bitmask,
    the best allowed token is taken (the reference, independent of the loop's processors)."""
    model = pipe.target.model
    grammar = pipe.grammar_compiler.compile(spec)
    matcher = grammar.matcher()
    vocab = pipe.target.vocab_size
    bitmask = xgr.allocate_token_bitmask(1, vocab)
    ids = pipe.encode(prompt)[0].tolist()
    out: list[int] = []
    for _ in range(new):
        logits = model(torch.tensor([ids + out])).logits[0, -1:].float()
        matcher.fill_next_token_bitmask(bitmask)
        xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=vocab)
        token = int(logits.argmax())
        out.append(token)
        assert matcher.accept_token(token)
        if matcher.is_terminated():
            break
    return out


@pytest.mark.parametrize("kind", list(SPECS))
def test_every_method_gives_the_targets_greedy_text_under_the_grammar(zoo, kind):
    spec = SPECS[kind]
    want = grammar_greedy(zoo["model"], PROMPT, spec, 40)
    assert want[-1] == zoo["model"].eos_token_id  # the grammar's end: its text is complete
    text = zoo["model"].tokenizer.decode(want, skip_special_tokens=True)
    if kind == "regex":
        assert re.fullmatch(spec.regex, text), text
    elif kind == "json_schema":
        assert set(json.loads(text)) >= {"name", "size"}
    for method, pipe in zoo.items():
        out = pipe.generate(PROMPT, max_new_tokens=40, processing=Processing(structured=spec))
        assert out.output.new_tokens[0].tolist() == want, (kind, method)
        assert out.text == text
        assert out.stats.accepted_tokens > 0, method  # drafts were kept under the grammar


def test_a_grammar_refused_by_xgrammar_names_its_field(zoo):
    compiler = zoo["model"].grammar_compiler
    for spec, field in ((Structured(regex="a("), "regex"), (Structured(json_schema={"type": "nope"}), "json_schema")):
        with pytest.raises(ProcessingError) as err:
            compiler.compile(spec)
        assert err.value.field == field and str(err.value).startswith(field + ": ")
    assert zoo["model"].grammar_compiler is compiler  # one per tokenizer: its cache keeps what it compiled


# ---- the cut, and the bitmask helpers -----------------------------------------------------------------------------
def grammar_rows(zoo, spec: Structured, batch: int) -> Processors:
    pipe = zoo["model"]
    made = Processors(pipe.target.vocab_size, {pipe.eos_token_id}, torch.device("cpu"))
    processing = pipe.compile_processing(Processing(structured=spec))
    made.add(made.check(processing, None, batch), [[1]] * batch)
    return made


def token(zoo, text: str) -> int:
    ids = zoo["model"].tokenizer(text, add_special_tokens=False).input_ids
    assert len(ids) == 1, (text, ids)
    return ids[0]


def state_of(rows: int) -> DecodingState:
    return DecodingState(torch.ones(rows, 1, dtype=torch.long), None, 1, SamplingParams(), None)


def test_a_chain_is_cut_before_the_first_token_the_grammar_forbids(zoo):
    a, b, c, x = (token(zoo, t) for t in "abcx")
    made = grammar_rows(zoo, Structured(regex="ab(c|b)+"), 2)
    draft = Draft(tokens=torch.tensor([[a, b, x, c], [a, b, c, b]]))
    cut = made.cut(draft, state_of(2))
    assert cut.tokens.tolist() == [[a, b, x, c], [a, b, c, b]] and cut.lengths.tolist() == [2, 4]
    made = grammar_rows(zoo, Structured(regex="ab(c|b)+"), 1)
    cut = made.cut(Draft(tokens=torch.tensor([[a, x, c]])), state_of(1))
    assert cut.tokens.tolist() == [[a]]  # one row: the forbidden columns are gone, the target never scores them
    logits = made(torch.zeros(1, 2, zoo["model"].target.vocab_size), state_of(1), cut)
    assert torch.isfinite(logits[0, 0, a]) and not torch.isfinite(logits[0, 0, b])  # position 0: only a may come
    assert torch.isfinite(logits[0, 1, b]) and not torch.isfinite(logits[0, 1, x])  # after a: b


def test_a_tree_loses_the_nodes_the_grammar_forbids_and_their_subtrees(zoo):
    a, b, c, x = (token(zoo, t) for t in "abcx")
    made = grammar_rows(zoo, Structured(regex="ab(c|b)+"), 1)
    tree = TreeSpec.from_parents([-1, -1, 0, 0, 1, 2])  # a -> {b, x}, x -> c, b -> c
    draft = Draft(tokens=torch.tensor([[a, x, b, x, c, c]]), tree=tree)
    cut = made.cut(draft, state_of(1))
    assert cut.valid.tolist() == [[True, False, True, False, False, True]]
    matcher = made.present[0].matchers[0]
    assert matcher.accept_token(a)  # the walk left the matcher where it was


def test_the_mask_is_the_same_on_every_path(zoo):
    """xgrammar's CPU kernel (float32 on the CPU) and the unpacked bitmask (other dtypes, other devices) agree."""
    a, b = token(zoo, "a"), token(zoo, "b")
    made = grammar_rows(zoo, Structured(regex="ab(c|b)+"), 1)
    cut = made.cut(Draft(tokens=torch.tensor([[a, b]])), state_of(1))
    given = torch.randn(1, 3, zoo["model"].target.vocab_size, generator=torch.Generator().manual_seed(0))
    fast = made(given, state_of(1), cut)
    wide = made(given.double(), state_of(1), cut)
    assert torch.equal(torch.isfinite(fast), torch.isfinite(wide)) and torch.equal(fast.double(), wide)
    assert torch.isfinite(fast).sum(dim=-1).tolist()[0][0] >= 1


def test_bitmask_helpers():
    words = pack([0, 31, 32, 65], 3)
    assert unpack(words, 70).nonzero().flatten().tolist() == [0, 31, 32, 65]
    first, sibling = layout([-1, -1, 0, 1, 0], limit=5, valid=[True, True, True, True, False])
    assert first.tolist() == [1, 3, 4, -1, -1, -1] and sibling.tolist() == [-1, 2, -1, -1, -1, -1]
    first, _ = layout([-1, 0, 1], limit=2, valid=None)  # a ragged chain's row: its own length only
    assert first.tolist() == [1, 2, -1, -1]


# ---- llama.cpp ----------------------------------------------------------------------------------------------------
def test_every_method_gives_the_same_text_under_the_grammar_on_llamacpp():
    pytest.importorskip("llama_cpp", reason="the llamacpp extra is not installed")
    from draftverify.backends.gguf import converter_available

    if not converter_available():
        pytest.skip("no llama.cpp converter: scripts/fetch_llama_cpp_converter.sh")
    texts = {}
    for method in ("autoregressive", "prompt_lookup", "model", "model_tree"):
        pipe = load(zoo="code", method=method, backend="llamacpp", threads=1, gamma=4)
        out = pipe.generate(PROMPT, max_new_tokens=40, processing=Processing(structured=SPECS["json_schema"]))
        texts[method] = out.output.new_tokens[0].tolist()
        assert method == "autoregressive" or out.stats.accepted_tokens > 0, method
    assert all(t == texts["autoregressive"] for t in texts.values()), texts  # the target alone's text, on llama.cpp
    assert texts["autoregressive"][-1] == pipe.eos_token_id

"""The llama.cpp backend's rows: batches of 2 / 4 / 8 prompts of different lengths on one context, each row's
greedy text equal to its batch-1 text (autoregressive, prompt_lookup and a llama.cpp draft model), one
llama_decode per step for every row, rows leaving and joining between steps (continuous batching), and what rows
refuse (trees, methods that cannot batch on llama.cpp) in one line."""

from __future__ import annotations

import pytest
import torch

llama_cpp = pytest.importorskip("llama_cpp", reason="the llamacpp extra is not installed")


from conftest import left_padded, tiny_gguf_pair  # noqa: E402
from draftverify import DraftVerifyError, generate  # noqa: E402
from draftverify.backends.base import check_backend  # noqa: E402
from draftverify.backends.gguf import converter_available  # noqa: E402
from draftverify.backends.llamacpp import LlamaCppLM  # noqa: E402
from draftverify.methods import MethodOptions, build_drafter, build_verifier, resolve_method  # noqa: E402
from draftverify.registry import DRAFTERS  # noqa: E402
from draftverify.types import RowRequest, SamplingParams  # noqa: E402

pytestmark = pytest.mark.skipif(
    not converter_available(), reason="no llama.cpp converter: scripts/fetch_llama_cpp_converter.sh"
)

BATCH_METHODS = ("autoregressive", "prompt_lookup", "model", "lookup_model", "suffix")
# prompts of different lengths, some repeating themselves (prompt lookup finds drafts), one of a single token
PROMPTS = [
    [5, 17, 99, 230, 7, 5, 17, 99, 230, 7, 5, 17],
    [41, 8],
    [300, 12, 77, 300, 12, 77, 300, 12],
    [9],
    [120, 45, 66, 120, 45, 66, 120, 45, 66, 120, 45, 66, 120, 45, 66, 120],
    [3, 250, 18, 90, 3, 250],
    [77, 77, 77, 77, 77],
    [14, 28, 56, 112, 224, 14, 28, 56, 112],
]
NEW = 24


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, request):
    """A tiny random Llama target (f32 GGUF) and a noisy copy of it as the draft (the backend's default draft
    type): the draft agrees on some tokens, not all."""
    return tiny_gguf_pair(
        tmp_path_factory.mktemp("llamacpp-rows"), request.config.rootpath / "zoo" / "code" / "tokenizer"
    )


def setup(tiny, method: str, gamma: int = 4):
    spec = resolve_method(method)
    options = MethodOptions(
        draft_model=LlamaCppLM(tiny["draft"], role="draft", threads=1) if spec.needs_draft else None,
        prompt_lookup_min_ngram=1,
        suffix_min_match=1,  # short matches, as on hf: these prompts are too short for llama.cpp's default
    )
    target = LlamaCppLM(tiny["target"], threads=1)
    drafter = build_drafter(spec.drafter, target, options)
    return target, drafter, build_verifier(spec.verifier, SamplingParams(), options)


_ALONE: dict = {}


def alone(tiny, method: str, prompt: list[int], new: int = NEW) -> list[int]:
    """The prompt's batch-1 text on the same backend and method."""
    key = (method, tuple(prompt), new)
    if key not in _ALONE:
        target, drafter, verifier = setup(tiny, method)
        out = generate(target, drafter, verifier, torch.tensor([prompt]), max_new_tokens=new, gamma=4)
        _ALONE[key] = out.rows[0]
    return _ALONE[key]


@pytest.mark.parametrize("method", BATCH_METHODS)
@pytest.mark.parametrize("rows", [2, 4, 8])
def test_each_row_of_a_batch_equals_its_batch_1_text(tiny, method, rows):
    prompts = PROMPTS[:rows]
    target, drafter, verifier = setup(tiny, method)
    ids, mask = left_padded(prompts)
    out = generate(target, drafter, verifier, ids, attention_mask=mask, max_new_tokens=NEW, gamma=4)
    for b, prompt in enumerate(prompts):
        assert out.rows[b] == alone(tiny, method, prompt), f"{method}, row {b} of {rows}"
    if method != "autoregressive":
        assert out.stats.accepted_tokens > 0, "no draft was ever accepted: the rows' commits are untested"
    if method == "model":
        assert out.stats.rejections > 0, "every draft accepted: the rows' rollback is untested"


@pytest.mark.parametrize("method", ["autoregressive", "model"])
def test_one_decode_per_forward_for_every_row(tiny, monkeypatch, method):
    """Every row's new tokens (and, at the first forward, every row's prompt) in one llama_decode per forward, the
    target's and the llama.cpp draft's alike."""
    target, drafter, verifier = setup(tiny, method)
    decodes = []
    original = LlamaCppLM._decode

    def counted(self, n):
        decodes.append((self.role, n))
        return original(self, n)

    monkeypatch.setattr(LlamaCppLM, "_decode", counted)
    ids, mask = left_padded(PROMPTS[:4])
    out = generate(target, drafter, verifier, ids, attention_mask=mask, max_new_tokens=NEW, gamma=4)
    by_target = [n for role, n in decodes if role == "target"]
    assert len(by_target) == out.stats.target_calls
    assert len(decodes) - len(by_target) == out.stats.draft_calls
    first = sum(len(p) for p in PROMPTS[:4])  # the prompts and each row's pending token
    assert decodes[0][1] == first and (method == "autoregressive" or decodes[0][0] == "draft")


def test_a_ragged_chains_padding_is_scored_only_as_filler_that_leaves_no_cells(tiny, monkeypatch):
    """Prompt lookup drafts a different length per row: the verify pass outputs each row's pending token and its
    own draft only (the longest row's width is padding), decodes padding only as filler that saves micro-batches,
    and leaves no filler in the cache; every row keeps its batch-1 text."""
    target, drafter, verifier = setup(tiny, "prompt_lookup")
    outputs = []
    original = LlamaCppLM._decode_entries

    def counted(self, entries):
        if self.role == "target":
            outputs.append(sum(entry[3] for entry in entries))
        return original(self, entries)

    scored = []
    forward = target.forward
    pos_max = llama_cpp.llama_cpp.llama_memory_seq_pos_max

    def recorded(tokens, *args, **kwargs):
        scored.append(sum(len(row) for row in tokens))  # the step hands llama.cpp host ints (takes_host_ids)
        out = forward(tokens, *args, **kwargs)
        assert [pos_max(target.memory, s) + 1 for s in target.seqs] == target.held, "filler left in the cache"
        return out

    monkeypatch.setattr(LlamaCppLM, "_decode_entries", counted)
    monkeypatch.setattr(target, "forward", recorded)
    ids, mask = left_padded(PROMPTS[:4])
    out = generate(target, drafter, verifier, ids, attention_mask=mask, max_new_tokens=NEW, gamma=4)
    for b, prompt in enumerate(PROMPTS[:4]):
        assert out.rows[b] == alone(tiny, "prompt_lookup", prompt), f"row {b}"
    assert out.stats.accepted_tokens > 0
    later = list(zip(outputs[1:], scored[1:]))  # past the first forward, which decodes the prompts too
    assert any(o < s for o, s in later), "no ragged draft: the padding is untested"
    assert all(o <= s for o, s in later)


def test_a_draft_models_rows_ask_for_the_last_fed_columns_logits_alone(tiny, monkeypatch):
    """The draft model catches each row up on its committed tokens and reads the last one's logits only: each of
    its decodes after the first (which carries the prompts) has one output per row it feeds, however many tokens
    a row feeds; every row keeps its batch-1 text."""
    target, drafter, verifier = setup(tiny, "model")
    decodes = []
    original = LlamaCppLM._decode_entries

    def counted(self, entries):
        if self.role == "draft":
            decodes.append((len(entries), sum(e[3] for e in entries), len({e[2] for e in entries})))
        return original(self, entries)

    monkeypatch.setattr(LlamaCppLM, "_decode_entries", counted)
    ids, mask = left_padded(PROMPTS[:4])
    out = generate(target, drafter, verifier, ids, attention_mask=mask, max_new_tokens=NEW, gamma=4)
    for b, prompt in enumerate(PROMPTS[:4]):
        assert out.rows[b] == alone(tiny, "model", prompt), f"row {b}"
    later = decodes[1:]
    assert all(outputs == rows for _, outputs, rows in later)
    assert any(fed > rows for fed, _, rows in later), "no row caught up on more than one token: untested"


def test_rows_that_leave_from_the_middle_leave_no_gap_in_the_sequence_ids(tiny):
    """llama.cpp splits a batch into micro-batches of consecutive sequence ids: when a row leaves, the row with the
    highest id moves into its id, and every row still equals its batch-1 text."""
    target, drafter, verifier = setup(tiny, "model")
    limits = [4, 24, 6, 24, 24, 9]
    ids, mask = left_padded(PROMPTS[:6])
    seen = []
    out = generate(
        target,
        drafter,
        verifier,
        ids,
        attention_mask=mask,
        max_new_tokens=limits,
        gamma=4,
        on_tokens=lambda emitted: seen.append(sorted(target.seqs)) and None,
    )
    for b, prompt in enumerate(PROMPTS[:6]):
        assert out.rows[b] == alone(tiny, "model", prompt, limits[b]), f"row {b}"
    assert len(seen[-1]) < 6 and all(ids == list(range(len(ids))) for ids in seen)
    assert sorted(drafter.lm.seqs) == list(range(len(drafter.lm.seqs)))


@pytest.mark.parametrize("method", BATCH_METHODS)
def test_rows_leave_and_join_between_steps_with_their_batch_1_texts(tiny, method):
    """Continuous batching: rows with short limits finish early and leave; waiting prompts join, each in a free
    sequence, and every row's text equals its batch-1 text."""
    target, drafter, verifier = setup(tiny, method)
    first = [PROMPTS[0], PROMPTS[1], PROMPTS[2]]
    limits = [NEW, 5, 9]
    waiting = [RowRequest(PROMPTS[k], NEW) for k in (4, 5, 6, 7)]

    def admit():
        return [waiting.pop(0)] if waiting else []

    ids, mask = left_padded(first)
    out = generate(target, drafter, verifier, ids, attention_mask=mask, max_new_tokens=limits, gamma=4, admit=admit)
    prompts = first + [PROMPTS[k] for k in (4, 5, 6, 7)]
    assert len(out.rows) == len(prompts) and not waiting
    for b, (prompt, limit) in enumerate(zip(prompts, limits + [NEW] * 4)):
        assert out.rows[b] == alone(tiny, method, prompt)[:limit], f"{method}, row {b}"


def test_a_left_rows_cells_go_and_a_joining_row_takes_the_next_sequence_id(tiny):
    """On streams the last row moves into a left row's id (its cells with it); a joining row takes the next id."""
    lm = LlamaCppLM(tiny["target"], threads=1)
    ids, mask = left_padded(PROMPTS[:3])
    lm.start(ids, attention_mask=mask)
    lm.forward(ids[:, -1:])  # the prompts and each row's pending token
    lm.commit_rows(torch.tensor([1, 1, 1]))
    assert lm.seqs == [0, 1, 2] and lm.row_length.tolist() == [len(p) for p in PROMPTS[:3]]
    pos_max = llama_cpp.llama_cpp.llama_memory_seq_pos_max
    assert pos_max(lm.memory, 1) == len(PROMPTS[1]) - 1
    lm.drop_rows(torch.tensor([True, False, True]))
    assert lm.seqs == [0, 1] and pos_max(lm.memory, 2) == -1  # the left row's cells are gone, the last row moved
    assert pos_max(lm.memory, 1) == len(PROMPTS[2]) - 1
    joining, joining_mask = left_padded([PROMPTS[4]])
    lm.join_rows(joining, joining_mask)
    assert lm.seqs == [0, 1, 2] and lm.row_length.tolist()[-1] == len(PROMPTS[4]) - 1
    lm.forward(torch.tensor([[1], [2], [3]]))  # an uncommitted tail: no row may leave now
    with pytest.raises(DraftVerifyError, match="between steps only"):
        lm.drop_rows(torch.tensor([True, True, False]))


@pytest.mark.parametrize("streams", [True, False])
def test_the_context_grows_with_its_rows_and_keeps_them(tiny, streams):
    """Rows outgrowing the context's cells mid-generation: a larger context is made and every held row copied
    across, on a stream per row or (a sliding-window or recurrent model's way) on one unified cache; a context
    whose size was given refuses in one line instead."""
    target, drafter, verifier = setup(tiny, "model")
    target.streams = drafter.lm.streams = streams
    cells = target.n_ctx  # one request's room (the tiny model's 256 positions and the tree room)
    ids, mask = left_padded(PROMPTS)
    long = 90
    out = generate(target, drafter, verifier, ids, attention_mask=mask, max_new_tokens=long, gamma=4)
    assert target.n_ctx > cells and sum(len(p) + long for p in PROMPTS) > cells
    assert target.row_slots == (len(PROMPTS) if streams else None)
    for b, prompt in enumerate(PROMPTS):
        assert out.rows[b] == alone(tiny, "model", prompt, long), f"row {b}"
    fixed = LlamaCppLM(tiny["target"], threads=1, n_ctx=cells)
    with pytest.raises(DraftVerifyError, match="holds .* cells \\(n_ctx\\); its rows need") as err:
        generate(fixed, setup(tiny, "autoregressive")[1], verifier, ids, attention_mask=mask, max_new_tokens=long)
    assert "\n" not in str(err.value)


def test_rows_run_on_a_kv_stream_per_row_slot_and_one_row_keeps_them_until_a_tree(tiny):
    """Rows: kv_unified off, one KV stream per row slot (n_seq_max = the rows, each stream n_ctx / n_seq_max cells),
    as llama.cpp reports it. One row after them keeps the streams while it scores chains (no context made again
    per request) and goes to one unified cache when it scores a token tree (whose branches share the prefix's
    cells); its texts, chain and tree, equal those of a backend that never held rows."""
    lib = llama_cpp.llama_cpp
    target, drafter, verifier = setup(tiny, "prompt_lookup")
    assert target.streams and target.row_slots is None
    assert lib.llama_n_seq_max(target.ctx) == 1 and lib.llama_n_ctx_seq(target.ctx) == target.n_ctx  # no tree yet
    ids, mask = left_padded(PROMPTS[:3])
    target.start(ids, attention_mask=mask)
    assert target.row_slots == 3 == lib.llama_n_seq_max(target.ctx)
    assert lib.llama_n_ctx_seq(target.ctx) == target.n_ctx_seq and target.n_ctx == 3 * target.n_ctx_seq
    target.forward(ids[:, -1:])
    target.commit_rows(torch.tensor([1, 1, 1]))
    pos_max = lib.llama_memory_seq_pos_max
    assert [pos_max(target.memory, s) for s in range(3)] == [len(p) - 1 for p in PROMPTS[:3]]

    made = []
    original = LlamaCppLM._make_context

    def counted(self, cells, slots=None):
        made.append(slots)
        return original(self, cells, slots)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(LlamaCppLM, "_make_context", counted)
        for prompt in PROMPTS[:2]:
            out = generate(target, drafter, verifier, torch.tensor([prompt]), max_new_tokens=NEW, gamma=4)
            assert out.rows[0] == alone(tiny, "prompt_lookup", prompt)
        assert made == [] and target.row_slots == 3
        spec, options = resolve_method("prompt_lookup_tree"), MethodOptions(prompt_lookup_min_ngram=1)
        tree = build_drafter(spec.drafter, target, options)
        tree_verifier = build_verifier(spec.verifier, SamplingParams(), options)
        out = generate(target, tree, tree_verifier, torch.tensor([PROMPTS[4]]), max_new_tokens=NEW, gamma=4)
    assert made == [None] and target.row_slots is None and lib.llama_n_seq_max(target.ctx) == target.max_sequences
    assert out.rows[0] == alone(tiny, "prompt_lookup_tree", PROMPTS[4])


def test_rows_keep_their_batch_1_texts_when_more_join_than_the_context_has_streams(tiny):
    """Two rows start (two streams); six more join two at a time: the context is made again with more streams
    (twice as many) twice, every held row copied to its stream, and every row's text, the llama.cpp draft's rows
    included, equals its batch-1 text."""
    target, drafter, verifier = setup(tiny, "model")
    draft = drafter.lm
    waiting = [RowRequest(PROMPTS[k], NEW) for k in range(2, 8)]
    made = []
    original = LlamaCppLM._make_context

    def counted(self, cells, slots=None):
        made.append((self.role, slots))
        return original(self, cells, slots)

    def admit():
        return [waiting.pop(0) for _ in range(min(2, len(waiting)))]

    ids, mask = left_padded(PROMPTS[:2])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(LlamaCppLM, "_make_context", counted)
        out = generate(target, drafter, verifier, ids, attention_mask=mask, max_new_tokens=NEW, gamma=4, admit=admit)
    assert not waiting and len(out.rows) == len(PROMPTS)
    for b, prompt in enumerate(PROMPTS):
        assert out.rows[b] == alone(tiny, "model", prompt), f"row {b}"
    for lm in (target, draft):
        assert [slots for role, slots in made if role == lm.role] == [2, 4, 8]
        assert lm.row_slots == 8 == llama_cpp.llama_cpp.llama_n_seq_max(lm.ctx)


def test_held_rows_move_between_contexts_with_their_cells(tiny):
    """A one-row generation that a row joins moves to a stream per row, and rows moved to more streams of more
    cells, keep their cells: the next forward's logits are those of a backend that never moved."""
    pos_max = llama_cpp.llama_cpp.llama_memory_seq_pos_max
    moved, still = LlamaCppLM(tiny["target"], threads=1), LlamaCppLM(tiny["target"], threads=1)
    moved.start(torch.tensor([PROMPTS[0]]))
    moved.forward(torch.tensor([PROMPTS[0][-1:]]))
    moved.commit(1)
    assert moved.row_slots is None
    moved.join_rows(*left_padded([PROMPTS[2]]))  # one-row mode -> rows: sequence 0 copied to stream 0
    assert moved.row_slots == 2 and pos_max(moved.memory, 0) == len(PROMPTS[0]) - 1
    ids, mask = left_padded([PROMPTS[0] + [1], PROMPTS[2]])
    still.start(ids, attention_mask=mask)
    for lm in (moved, still):
        lm.forward(torch.tensor([[1], [PROMPTS[2][-1]]]))
        lm.commit_rows(torch.tensor([0, 1]))
    cells = moved.n_ctx_seq
    moved._grow(2 * cells, 4)
    assert (moved.row_slots, moved.n_ctx_seq) == (4, 2 * cells)
    assert [pos_max(moved.memory, s) for s in (0, 1)] == [pos_max(still.memory, s) for s in (0, 1)]
    step = torch.tensor([[1, 2], [3, 4]])
    assert torch.equal(moved.forward(step).logits, still.forward(step).logits)


def test_one_row_trees_after_rows_on_the_same_backend(tiny):
    """A tree method's one-row generation after a rows generation on the same target and draft: back on one
    unified cache, its text is the plain greedy text."""
    target = LlamaCppLM(tiny["target"], threads=1)
    draft = LlamaCppLM(tiny["draft"], role="draft", threads=1)
    options = MethodOptions(draft_model=draft, prompt_lookup_min_ngram=1)
    ids, mask = left_padded(PROMPTS[:4])
    for method, prompts in (
        ("model", None),
        ("model_tree", [PROMPTS[0]]),
        ("model", None),
        ("model_tree", [PROMPTS[4]]),
    ):
        spec = resolve_method(method)
        drafter = build_drafter(spec.drafter, target, options)
        verifier = build_verifier(spec.verifier, SamplingParams(), options)
        if prompts is None:
            out = generate(target, drafter, verifier, ids, attention_mask=mask, max_new_tokens=NEW, gamma=4)
            assert target.row_slots == 4 and out.rows == [alone(tiny, "model", p) for p in PROMPTS[:4]]
            continue
        out = generate(target, drafter, verifier, torch.tensor(prompts), max_new_tokens=NEW, gamma=4)
        assert target.row_slots is None and draft.row_slots is None
        assert out.rows[0] == alone(tiny, "autoregressive", prompts[0]) and out.stats.accepted_tokens > 0


def test_seeded_sampling_rows_equal_their_own_seeded_text(tiny):
    """Coupled sampling on rows: row b's text is its batch-1 text for seed b (a llama.cpp draft model)."""
    params = SamplingParams(temperature=0.9, top_p=0.95, coupling=True)
    prompts, seeds = PROMPTS[:4], [3, 4, 5, 6]
    expected = []
    for prompt, seed in zip(prompts, seeds):
        target, drafter, _ = setup(tiny, "model")
        verifier = build_verifier("exact", params, MethodOptions())
        one = generate(target, drafter, verifier, torch.tensor([prompt]), params, max_new_tokens=NEW, seeds=[seed])
        expected.append(one.rows[0])
    target, drafter, _ = setup(tiny, "model")
    ids, mask = left_padded(prompts)
    verifier = build_verifier("exact", params, MethodOptions())
    out = generate(target, drafter, verifier, ids, params, attention_mask=mask, max_new_tokens=NEW, seeds=seeds)
    assert out.rows == expected
    assert expected != [alone(tiny, "model", p) for p in prompts]  # sampled, not greedy


def test_the_rows_prefilled_logits_are_each_prompts_own(tiny):
    """prefilled: each row's logits at its last prompt position [B, 1, V] (zeros for a one-token prompt)."""
    prompts = [PROMPTS[0], PROMPTS[3], PROMPTS[2]]
    rows = LlamaCppLM(tiny["target"], threads=1)
    ids, mask = left_padded(prompts)
    rows.start(ids, attention_mask=mask)
    got = rows.prefilled.logits  # [3, 1, V]
    assert got.shape == (3, 1, rows.vocab_size) and not bool(got[1].any())
    for b in (0, 2):
        one = LlamaCppLM(tiny["target"], threads=1)
        one.start(torch.tensor([prompts[b]]))
        assert torch.allclose(got[b], one.prefilled.logits[0], atol=1e-3)


def test_trees_and_methods_that_cannot_batch_on_llama_cpp_are_refused_in_one_line(tiny):
    target = LlamaCppLM(tiny["target"], threads=1)
    ids, mask = left_padded(PROMPTS[:2])
    target.start(ids, attention_mask=mask)
    with pytest.raises(DraftVerifyError, match="token trees one row at a time") as err:
        target.forward(ids[:, -2:], torch.tensor([[4, 5]]), torch.ones(2, 2, dtype=torch.bool).tril())
    assert "\n" not in str(err.value)
    for method in ("model_tree", "prompt_lookup_tree"):
        drafter_cls = DRAFTERS[resolve_method(method).drafter]
        check_backend(LlamaCppLM, drafter_cls, method)  # one row: runs
        with pytest.raises(DraftVerifyError, match="token trees in batches of several rows") as err:
            check_backend(LlamaCppLM, drafter_cls, method, batched=True)
        assert "\n" not in str(err.value)
    eagle3 = DRAFTERS[resolve_method("eagle3").drafter]  # its chains batch: each row's features (layer_inputs)
    check_backend(LlamaCppLM, eagle3, "eagle3", batched=True)
    target, drafter, verifier = setup(tiny, "prompt_lookup_tree")
    with pytest.raises(DraftVerifyError, match="token trees in batches"):
        generate(target, drafter, verifier, ids, attention_mask=mask, max_new_tokens=4)


def test_the_command_line_generates_batches_equal_to_batch_1(tiny, tmp_path, monkeypatch):
    """generate --backend llamacpp --prompts-file --batch-size 4: each text equals --batch-size 1's; a tree method
    in batches is refused before anything loads, in one line."""
    import json

    from typer.testing import CliRunner

    from draftverify.cli import app

    monkeypatch.setenv("DRAFTVERIFY_GGUF_CACHE", str(tiny["root"] / "gguf"))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def add(a, b):\nimport os\nclass Stack:\nx = [1, 2, 3]\nwhile True:\n")
    base = ["generate", "--target", str(tiny["root"] / "target"), "--draft", str(tiny["root"] / "draft")]
    base += ["--prompts-file", str(prompts), "-n", "12", "--threads", "1", "--backend", "llamacpp", "--json"]
    runner = CliRunner()
    for method in ("model", "lookup_model"):
        texts = {}
        for size in ("1", "4"):
            result = runner.invoke(app, base + ["--method", method, "--batch-size", size])
            assert result.exit_code == 0, result.stderr
            texts[size] = [r["text"] for r in json.loads(result.stdout)["results"]]
        assert texts["4"] == texts["1"] and len(texts["1"]) == 5, method
    refused = runner.invoke(app, base + ["--method", "model_tree", "--batch-size", "2"])
    assert refused.exit_code == 2 and "token trees in batches of several rows" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1

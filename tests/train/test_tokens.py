import pytest
from tiny_corpus import write_tiny_corpus

from draftverify.train import tokens
from draftverify.train.tokenizer import build_tokenizer_from_corpus


def _quiet(msg):
    pass


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tokens")
    root = write_tiny_corpus(tmp / "lib", n_files=24, repeat=4)
    build_tokenizer_from_corpus(tmp / "tok", tmp / "manifest.json", vocab_size=300, root=root, val_fraction=0.3)
    return tmp


def test_token_cache(assets):
    from draftverify.train import corpus
    from draftverify.train.tokenizer import load_tokenizer

    tok = load_tokenizer(assets / "tok")
    m = corpus.load_manifest(assets / "manifest.json")
    data = tokens.load_token_cache(m, str(assets / "tok"), tok, str(assets / "cache"), log=_quiet)
    assert data["train"].dtype.name == "uint16" and data["val"].dtype.name == "uint16"
    n_docs = m["counts"]["train"]
    assert int((data["train"] == tok.eos_token_id).sum()) == n_docs  # one eos per document
    first = next(corpus.iter_texts(m, "train"))
    end = list(data["train"]).index(tok.eos_token_id)
    assert tok.decode(list(map(int, data["train"][:end]))) == first
    # second call hits the cache (same files, same arrays)
    again = tokens.load_token_cache(m, str(assets / "tok"), tok, str(assets / "cache"), log=_quiet)
    assert (again["val"] == data["val"]).all()

"""posbias/retrieval/bm25.py: BM25 score blocks through bm25s, against the formula worked out by
hand in float64 (Lucene's idf, no (k1 + 1) factor), plus the tokenizer and the missing-library error."""
import importlib.util
import math
import subprocess
import sys

import numpy as np
import pytest

from posbias.errors import ConfigError
from posbias.retrieval.bm25 import bm25_scores, tokenize
from posbias.retrieval.metrics import gold_ranks

needs_bm25s = pytest.mark.skipif(importlib.util.find_spec("bm25s") is None,
                                 reason="bm25s not installed (pip install bm25s)")

# Tokens: P0 [cat, sat, mat] (3), P1 [dog, chased, cat, cat, ran] (5), P2 [dogs, birds] (2); avgdl 10/3.
PASSAGES = ["The cat sat on the mat.", "A dog chased the cat; the cat ran.", "Dogs and birds!"]
# Q0 [where, cat] ("where" is in no passage), Q1 [dog, dog, mat] (a repeated token counts twice).
QUERIES = ["Where is the cat?", "dog, DOG and mat"]


def all_scores(passages, queries, **kw):
    blocks = list(bm25_scores(passages, queries, **kw))
    return np.concatenate([s for _, s in blocks]) if blocks else np.zeros((0, len(passages)), np.float32)


def hand_bm25(k1, b):
    """The (2, 3) scores of QUERIES against PASSAGES, term by term."""
    n, avgdl = 3, 10 / 3

    def idf(df):
        return math.log(1 + (n - df + 0.5) / (df + 0.5))

    def tf_part(tf, dl):
        return tf / (tf + k1 * (1 - b + b * dl / avgdl))

    idf_cat, idf_dog, idf_mat = idf(2), idf(1), idf(1)  # cat in P0 and P1; dog in P1; mat in P0
    return np.array([
        [idf_cat * tf_part(1, 3), idf_cat * tf_part(2, 5), 0.0],
        [idf_mat * tf_part(1, 3), 2 * idf_dog * tf_part(1, 5), 0.0],  # "dogs" (P2) is not "dog": no stemming
    ], dtype=np.float64)


def test_tokenize_lowercases_splits_on_non_alphanumerics_and_drops_stop_words():
    assert tokenize("The Café-au-lait costs 42€, isn't it? snake_case") == \
        ["café", "au", "lait", "costs", "42", "isn", "t", "snake", "case"]
    assert tokenize("the of and, to.") == []
    assert tokenize("The end", stop_words=frozenset()) == ["the", "end"]


@needs_bm25s
@pytest.mark.parametrize("k1, b", [(1.5, 0.75), (1.2, 0.3)])
def test_scores_match_the_formula_by_hand(k1, b):
    got = all_scores(PASSAGES, QUERIES, k1=k1, b=b)
    assert got.dtype == np.float32 and got.shape == (2, 3)
    np.testing.assert_allclose(got, hand_bm25(k1, b), rtol=1e-6, atol=0)
    assert got[0, 2] == 0.0 and got[1, 2] == 0.0  # no shared token: exactly 0


@needs_bm25s
def test_a_query_sharing_no_token_scores_zero():
    got = all_scores(PASSAGES, ["zebras?", "the and of", "", "dogs"])
    assert (got[:3] == 0).all()  # unknown token, only stop words, empty
    assert got[3].tolist()[:2] == [0.0, 0.0] and got[3, 2] > 0


@needs_bm25s
def test_blocks_cover_every_query_in_order():
    queries = [QUERIES[i % 2] for i in range(7)]
    blocks = list(bm25_scores(PASSAGES, queries, batch=3))
    assert [lo for lo, _ in blocks] == [0, 3, 6]
    assert [s.shape for _, s in blocks] == [(3, 3), (3, 3), (1, 3)]
    assert all(s.dtype == np.float32 for _, s in blocks)
    whole = all_scores(PASSAGES, queries)  # one block of 1024
    np.testing.assert_array_equal(np.concatenate([s for _, s in blocks]), whole)
    np.testing.assert_array_equal(whole[::2], np.broadcast_to(whole[0], (4, 3)))
    assert list(bm25_scores(PASSAGES, [])) == []


@needs_bm25s
def test_each_question_ranks_its_own_passage_first():
    passages = ["Paris is the capital of France, on the Seine.",
                "The Amazon river flows through Brazil into the Atlantic.",
                "Photosynthesis turns light, water and carbon dioxide into sugar.",
                "The capital of Brazil is Brasilia, not Rio."]
    queries = ["Which river flows into the Atlantic through Brazil?", "What is the capital of France?",
               "What does photosynthesis turn into sugar?", "Is Rio the capital of Brazil?"]
    gold = np.array([1, 0, 2, 3])
    scores = all_scores(passages, queries)
    assert scores.argmax(1).tolist() == gold.tolist()
    assert gold_ranks(scores, gold).tolist() == [1.0, 1.0, 1.0, 1.0]
    # second place: the other passage naming Brazil / a capital
    assert np.argsort(-scores[0])[1] == 3 and np.argsort(-scores[3])[1] in (0, 1)


def test_passages_without_any_token_score_zero_without_the_library(monkeypatch):
    monkeypatch.setitem(sys.modules, "bm25s", None)  # not even imported: nothing to index
    assert (all_scores(["the", "of a"], ["cat", "the"]) == 0).all()


def test_missing_library_is_a_config_error_naming_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "bm25s", None)  # `import bm25s` raises ImportError
    with pytest.raises(ConfigError, match="pip install bm25s"):
        bm25_scores(PASSAGES, QUERIES)  # at the call, not at the first block
    with pytest.raises(ValueError, match="batch"):
        bm25_scores(PASSAGES, QUERIES, batch=0)


def test_importing_posbias_does_not_import_bm25s():
    code = "import sys, posbias, posbias.retrieval.bm25; assert 'bm25s' not in sys.modules"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_missing_bm25s_is_refused_before_any_model_is_loaded(tmp_path):
    """`diagnose retrieval` names the extra in one line, exit 2, before loading the model or embedding
    anything (the bundled MiniLM would otherwise embed the demo set first)."""
    code = ("import sys; sys.modules['bm25s'] = None; from posbias.cli import main; "
            "import posbias.retrieval.diagnose as D; D.load_embedder = None; "  # a load would be a TypeError
            "sys.exit(main(['diagnose', 'retrieval', '--model', 'minilm', "
            f"'--data', 'demo:dev', '--output-dir', {str(tmp_path / 'o')!r}]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr[-2000:]
    err = done.stderr.strip().splitlines()
    assert len(err) == 1 and 'pip install "posbias[retrieval]"' in err[0] and "--no-bm25" in err[0], err
    assert not (tmp_path / "o").exists()

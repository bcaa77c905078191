"""A retrieval diagnosis never ranks by NaN or infinite embeddings: a model of NaN weights is refused in
one line naming it (it scored NDCG@10 170.95, recall@1 100, MRR 200 before: NaN compares false, so
the gold passage ranked 0.5), a damaged cache entry of NaNs is recomputed from the model, and no
metric outside 0..100 points comes out of `per_query`."""
import json
import re

import numpy as np
import pytest
import torch
from helpers import run_cli
from safetensors.numpy import load_file, save_file
from transformers import BertConfig, BertModel

import posbias
from posbias.config import resolve_path
from posbias.encoders import open_tokenizer
from posbias.errors import ConfigError
from posbias.retrieval.metrics import gold_ranks, per_query

REFUSED = "embeddings are NaN or infinite"
FAST = {"max_queries": 20, "paired": False, "bm25": False, "chunks": False, "bootstrap_samples": 0,
        "min_bucket": 5, "precision": "fp32", "device": "cpu", "progress": False}


def _encoder(root, name: str, fill: float | None):
    """A tiny random plain BERT encoder folder; `fill`: every weight set to this value."""
    tok = open_tokenizer(resolve_path("tiny"))
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                 intermediate_size=64, max_position_embeddings=160))
    if fill is not None:
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(fill)
    folder = root / name
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("enc")
    return {"good": _encoder(root, "good", None), "nan": _encoder(root, "nan", float("nan"))}


def test_a_model_of_nan_weights_is_refused_naming_it(tmp_path, folders):
    msg = f"{folders['nan']}: the model's query {REFUSED} (its weights hold NaN/inf); posbias does not rank by them"
    with pytest.raises(ConfigError, match=f"^{re.escape(msg)}$"):
        posbias.diagnose(str(folders["nan"]), "demo:dev", tmp_path / "o", task="retrieval",
                         cache_dir=tmp_path / "cache", **FAST)
    assert not (tmp_path / "o").exists()
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())  # nothing cached


def test_the_cli_refuses_a_nan_model_in_one_line_with_exit_2(tmp_path, folders):
    r = run_cli("-q", "diagnose", "retrieval", "--model", str(folders["nan"]), "--data", "demo:dev",
                "--output-dir", str(tmp_path / "o"), "--max-queries", "20", "--no-bm25", "--no-paired",
                "--bootstrap-samples", "0", "--precision", "fp32", "--device", "cpu")
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"posbias: error: {folders['nan']}: ") \
        and REFUSED in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "o").exists()


def test_a_cache_entry_of_nans_is_recomputed_from_the_model(tmp_path, folders):
    """The cache is the model's output kept for later: an entry that is not what `encode` writes (NaN
    or inf, as a damaged or edited file, like the other damaged entries) is recomputed and rewritten,
    not refused: the model it came from is at hand and gives the right numbers."""
    cache = tmp_path / "cache"
    first = posbias.diagnose(str(folders["good"]), "demo:dev", tmp_path / "a", task="retrieval", cache_dir=cache,
                             **FAST)
    files = sorted(cache.glob("*.safetensors"))
    assert len(files) == 2  # queries, passages
    good = {f: load_file(f)["embeddings"] for f in files}
    for f, arr in good.items():
        bad = arr.copy()
        bad[0, 0], bad[-1] = np.nan, np.inf
        save_file({"embeddings": bad}, f)
    again = posbias.diagnose(str(folders["good"]), "demo:dev", tmp_path / "b", task="retrieval", cache_dir=cache,
                             **FAST)
    assert again["overall"] == first["overall"]
    assert all(0 <= v <= 100 for v in again["overall"]["dense"].values())
    for f, arr in good.items():  # rewritten with the model's own embeddings
        np.testing.assert_array_equal(load_file(f)["embeddings"], arr)


class NanBag:
    """A user's own embedder (any object with Embedder's members) whose passages come out NaN."""

    source = "my-nan-embedder"
    max_length, specials = 512, 2

    def __init__(self):
        self.tokenizer = open_tokenizer(resolve_path("tiny"))

    def count_tokens(self, text):
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def describe(self):
        return {"model": self.source}

    def encode(self, texts, role, batch_size=64, cache_dir=None, progress=False):
        out = np.ones((len(texts), 4), dtype=np.float32) / 2
        if role == "document":
            out[:] = np.nan
        return out


def test_a_users_embedder_returning_nan_is_refused_naming_it(tmp_path):
    with pytest.raises(ConfigError, match=rf"^my-nan-embedder: its passage {REFUSED}"):
        posbias.diagnose(NanBag(), "demo:dev", tmp_path / "o", task="retrieval", **FAST)
    assert not (tmp_path / "o").exists()


def test_nan_scores_and_ranks_below_one_never_become_metrics():
    scores = np.array([[0.1, np.nan, 0.3], [np.nan, np.nan, np.nan]])
    with pytest.raises(ValueError, match="gold_ranks: the scores hold NaN"):
        gold_ranks(scores, np.array([0, 1]))
    with pytest.raises(ValueError, match=r"per_query: NDCG@10 170\.9\d* is outside 0\.\.100 points \(gold rank 0\.5"):
        per_query(np.array([1.0, 0.5]))
    with pytest.raises(ValueError, match="outside 0..100 points"):
        per_query(np.array([np.nan]))
    ok = per_query(np.array([1.0, 2.5, 11.0]))  # ties at their expected rank: in range
    assert all(((v >= 0) & (v <= 100)).all() for v in ok.values())
    assert json.dumps({k: v.tolist() for k, v in ok.items()})  # finite: plain JSON

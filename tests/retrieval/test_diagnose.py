"""posbias/retrieval/diagnose.py (and embed.py): the retrieval diagnosis end to end.

A position-blind scorer (a bag of words: order is lost) must find no bias: in the paired variant its
documents at start, middle and end hold the same words, so every question ranks the same and PSI is
0. A scorer that reads only a passage's first words must show a large drop. Then the real paths: a
tiny random plain encoder (mean pooling) and the same encoder as a sentence-transformers folder,
through `posbias.diagnose(task="retrieval")` and the CLI, with the report's files and the cache."""
import json
import re
import zlib

import numpy as np
import pytest
import torch
from helpers import run_cli
from transformers import BertConfig, BertModel

import posbias
from posbias.config import resolve_path
from posbias.encoders import open_tokenizer
from posbias.errors import ConfigError
from posbias.precision import Precision
from posbias.retrieval.diagnose import chunk_passages, maxsim_blocks, ranks_from_blocks
from posbias.retrieval.embed import check_st_modules

DIM = 512


class WordBag:
    """An embedder that hashes words into a vector: `first` keeps only a text's first words."""

    def __init__(self, first: int | None = None, max_length: int = 512):
        self.first, self.max_length, self.specials = first, max_length, 2
        self.tokenizer = open_tokenizer(resolve_path("tiny"))
        self.source = f"bag(first={first})"
        self.calls = 0

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])

    def describe(self) -> dict:
        return {"model": self.source, "kind": "test", "max_length": self.max_length, "similarity": "cosine",
                "device": "cpu", "precision": Precision("fp32", "test", "fp32").to_dict()}

    def encode(self, texts, role, batch_size=64, cache_dir=None, progress=False):
        self.calls += 1
        out = np.zeros((len(texts), DIM), dtype=np.float32)
        for i, t in enumerate(texts):
            ws = re.findall(r"\w+", t.lower())
            for w in ws[: self.first] if self.first else ws:
                out[i, zlib.crc32(w.encode()) % DIM] += 1.0
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)


def run(model, tmp_path, name, **kw):
    kw = {"bm25": False, "bootstrap_samples": 200, "min_bucket": 20, **kw}
    return posbias.diagnose(model, "demo:dev", tmp_path / name, task="retrieval", progress=False, **kw)


def test_a_position_blind_scorer_shows_no_bias_and_a_myopic_one_does(tmp_path):
    blind = run(WordBag(), tmp_path, "blind")
    paired = blind["paired"]["methods"]["dense"]
    assert blind["paired"]["set"]["questions"] > 50
    assert paired["psi"] == 0.0  # the same words at every position: the same ranks
    assert all(d["effect"] == 0.0 for d in paired["differences"].values())
    assert len({json.dumps(p, sort_keys=True) for p in paired["positions"].values()}) == 1

    myopic = run(WordBag(first=25), tmp_path, "myopic")
    m = myopic["paired"]["methods"]["dense"]
    assert m["differences"]["start − end"]["effect"] > 20  # NDCG@10 points
    assert m["differences"]["start − end"]["ci"][0] > 0 and m["psi"] > 0.3
    axis = myopic["axes"]["dense: answer character"]
    assert axis["effect"] > 10 and axis["evidence"] == "yes"
    assert myopic["overall"]["dense"]["NDCG@10"] < blind["overall"]["dense"]["NDCG@10"]
    # best-chunk scoring reads every chunk's first words: it recovers most of what the myopic scorer loses
    assert myopic["overall"]["chunks"]["NDCG@10"] > myopic["overall"]["dense"]["NDCG@10"]
    assert myopic["verdict_lines"][0].startswith("Position diagnosis of bag(first=25)")
    assert any("paired" in x and "start − end" in x for x in myopic["verdict_lines"])
    out = tmp_path / "myopic"
    assert {p.name for p in out.iterdir()} >= {"diagnosis.md", "diagnosis.html", "diagnosis.json", "ranks.json",
                                              "run_info.json", "ndcg_by_position.png", "paired_positions.png"}
    ranks = json.loads((out / "ranks.json").read_text(encoding="utf-8"))
    assert len(ranks["query_ids"]) == len(ranks["dense"]) == myopic["questions"]
    text = (out / "diagnosis.md").read_text(encoding="utf-8")
    assert "## Paired: the same questions" in text and "NDCG@10 end" in text


def test_maxsim_takes_each_passages_best_chunk():
    tok = open_tokenizer(resolve_path("tiny"))
    passages = ["the cat sat on the mat and then it slept", "a dog", "birds sing in the morning light"]
    texts, owner = chunk_passages(passages, tok, chunk_tokens=3)
    assert owner.tolist() == sorted(owner.tolist()) and set(owner.tolist()) == {0, 1, 2}
    for i, p in enumerate(passages):  # the chunks tile their passage
        assert "".join(t for t, o in zip(texts, owner) if o == i).replace(" ", "") == p.replace(" ", "")
    q = np.array([[1.0, 0.0], [0.0, 1.0]])
    chunks = np.array([[0.2, 0.9], [0.8, 0.1], [0.5, 0.5], [0.1, 0.3], [0.9, 0.0]])
    own = np.array([0, 0, 1, 2, 2])
    (_, block), = list(maxsim_blocks(q, chunks, own, 3))
    np.testing.assert_allclose(block, [[0.8, 0.5, 0.9], [0.9, 0.5, 0.3]])
    assert ranks_from_blocks([(0, block)], np.array([2, 1])).tolist() == [1.0, 2.0]


@pytest.fixture(scope="module")
def encoder_folders(tmp_path_factory):
    """A tiny random BERT saved as a plain encoder folder, and the same one as a sentence-transformers
    folder (Transformer, mean Pooling, Normalize)."""
    root = tmp_path_factory.mktemp("enc")
    tok = open_tokenizer(resolve_path("tiny"))
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                 intermediate_size=64, max_position_embeddings=160))
    plain = root / "plain"
    model.save_pretrained(plain)
    tok.save_pretrained(plain)
    st = root / "st"
    model.save_pretrained(st)
    tok.save_pretrained(st)
    (st / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (st / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128, "do_lower_case": False}))
    (st / "1_Pooling").mkdir()
    (st / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32,
                                                              "pooling_mode_mean_tokens": True}))
    (st / "2_Normalize").mkdir()
    return plain, st


def test_a_plain_encoder_and_a_sentence_transformers_folder_diagnose_alike(tmp_path, encoder_folders):
    plain, st = encoder_folders
    kw = {"max_queries": 60, "paired": False, "precision": "fp32", "device": "cpu", "bootstrap_samples": 0}
    a = run(str(plain), tmp_path, "plain", cache_dir=tmp_path / "cache", **kw)
    assert a["model"]["kind"].startswith("mean pooling") and a["model"]["max_length"] == 160
    b = run(str(st), tmp_path, "st", max_length=160, **kw)
    assert b["model"]["kind"] == "sentence-transformers"
    # the same weights, the same mean pooling and normalisation: the same ranks
    ra = json.loads((tmp_path / "plain" / "ranks.json").read_text(encoding="utf-8"))
    rb = json.loads((tmp_path / "st" / "ranks.json").read_text(encoding="utf-8"))
    assert ra["dense"] == pytest.approx(rb["dense"])
    cached = sorted((tmp_path / "cache").glob("*.safetensors"))
    assert len(cached) == 3  # queries, passages, chunks
    again = run(str(plain), tmp_path, "plain2", cache_dir=tmp_path / "cache", **kw)
    assert again["overall"] == a["overall"] and sorted((tmp_path / "cache").glob("*.safetensors")) == cached


def test_a_folder_naming_foreign_module_code_is_refused(tmp_path, encoder_folders):
    _, st = encoder_folders
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in st.iterdir():
        if f.is_file():
            (bad / f.name).write_bytes(f.read_bytes())
    (bad / "modules.json").write_text(json.dumps([{"idx": 0, "name": "0", "path": "", "type": "evil.Module"}]))
    with pytest.raises(ConfigError, match=r"modules.json: module '0' is 'evil.Module', code outside"):
        check_st_modules(str(bad))
    r = run_cli("diagnose", "retrieval", "--model", str(bad), "--data", "demo:dev", "--output-dir", str(tmp_path / "o"))
    assert r.returncode == 2 and "evil.Module" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists()


def test_the_cli_diagnoses_retrieval(tmp_path, encoder_folders):
    plain, _ = encoder_folders
    r = run_cli("diagnose", "retrieval", "--model", str(plain), "--data", "demo:dev", "--output-dir", str(tmp_path / "o"),
                "--max-queries", "40", "--no-bm25", "--no-paired", "--bootstrap-samples", "0", "--precision", "fp32",
                "--device", "cpu", "--min-bucket", "5")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "retrieval" in r.stdout and "report:" in r.stdout
    res = json.loads((tmp_path / "o" / "diagnosis.json").read_text(encoding="utf-8"))
    assert res["questions"] == 40 and res["methods"] == ["dense", "chunks"] and res["paired"] is None


def test_loading_a_folder_with_an_unexpected_weight_prints_no_library_report(tmp_path, encoder_folders, capfd):
    """transformers' "LOAD REPORT ... UNEXPECTED" table and its progress bar stay silent for posbias's
    own load, and the library's logging state is the same after it."""
    from safetensors.torch import load_file, save_file
    from transformers.utils import logging as hf_logging

    from posbias.retrieval.embed import load_embedder

    _, st = encoder_folders
    stray = tmp_path / "stray"
    stray.mkdir()
    for f in st.rglob("*"):
        if f.is_file():
            (stray / f.relative_to(st)).parent.mkdir(parents=True, exist_ok=True)
            (stray / f.relative_to(st)).write_bytes(f.read_bytes())
    weights = load_file(stray / "model.safetensors")
    weights["stray.weight"] = torch.zeros(2)  # a key BertModel does not have: UNEXPECTED in the report
    save_file(weights, stray / "model.safetensors", metadata={"format": "pt"})
    before = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    capfd.readouterr()
    embedder = load_embedder(str(stray), device="cpu", precision="fp32")
    out, err = capfd.readouterr()
    assert embedder.kind == "sentence-transformers"
    assert "LOAD REPORT" not in out + err and "UNEXPECTED" not in out + err and "Loading weights" not in err
    assert (hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()) == before


def test_the_retrieval_report_names_model_and_data_and_warns_above_its_tables(tmp_path):
    res = run(WordBag(first=25), tmp_path, "r", max_queries=60, paired=False, bootstrap_samples=0,
              quality_floor=100.0)  # no model reaches it: the warning shows
    assert res["quality"]["below"] and "on demo:dev (retrieval)" in res["verdict_lines"][0]
    md = (tmp_path / "r" / "diagnosis.md").read_text(encoding="utf-8")
    lines = md.splitlines()
    assert lines[0] == "# Position diagnosis of bag(first=25) on demo:dev (retrieval)"
    assert str(resolve_path("demo:dev")) not in md and "- data: demo:dev: 60 answerable questions" in md
    warning = next(i for i, x in enumerate(lines) if x.startswith("> **Warning:** overall NDCG@10"))
    assert warning < next(i for i, x in enumerate(lines) if x.startswith("| axis |"))

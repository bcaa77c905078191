"""posbias/generation/diagnose.py and its fronts: `posbias diagnose generation` end to end on a tiny
random causal LM and a small SQuAD file, the files it writes, the score cache (a killed run resumes),
and one-line refusals."""
import json
import subprocess
import sys

import numpy as np
import pytest

import posbias
from posbias.errors import ConfigError
from posbias.generation import diagnose as D
from posbias.generation import lm as L
from tests.generation.tiny import gemma, tokenizer, wrap

ARTICLES = {
    "Rivers": ["The Nile flows north through Egypt into the sea.", "The Amazon carries more water than any river.",
               "The Danube crosses ten countries in Europe."],
    "Towers": ["The Eiffel Tower was built in 1889 in Paris.", "Big Ben is the bell in the clock tower in London.",
               "The CN Tower rises over Toronto in Canada."],
    "Painters": ["Vermeer painted the girl with a pearl earring.", "Monet painted water lilies at Giverny.",
                 "Goya painted the black paintings late in life."],
}
QUESTIONS = {"Egypt": "Where does the Nile flow?", "1889": "When was the Eiffel Tower built?",
             "London": "Where is Big Ben?", "Giverny": "Where did Monet paint water lilies?",
             "Toronto": "Which city has the CN Tower?", "Europe": "Where does the Danube flow?"}


def squad_file(tmp_path):
    data = []
    for title, paras in ARTICLES.items():
        ps = []
        for i, ctx in enumerate(paras):
            qas = [{"id": f"{title}{i}{j}", "question": q, "answers": [{"text": a, "answer_start": ctx.index(a)}]}
                   for j, (a, q) in enumerate(QUESTIONS.items()) if a in ctx]
            ps.append({"context": ctx, "qas": qas})
        data.append({"title": title, "paragraphs": ps})
    path = tmp_path / "small.json"
    path.write_text(json.dumps({"version": "1.1", "data": data}))
    return path


@pytest.fixture(scope="module")
def lm():
    tok = tokenizer()
    return wrap(gemma(tok), tok)


def run(lm, tmp_path, out="diag", **kw):
    opts = dict(k=3, scorings=("loglik", "generation"), bias_samples=50, min_bucket=2, cache_dir=tmp_path / "cache",
                max_new_tokens=3, progress=False)
    opts.update(kw)
    return D.diagnose(lm, squad_file(tmp_path), tmp_path / out, **opts)


def test_every_question_at_every_position_with_both_scorings_and_mitigations(lm, tmp_path):
    res = run(lm, tmp_path, mitigations=("reorder", "mspoe"), lengths=(80,), depths=(0.0, 1.0))
    out = tmp_path / "diag"
    assert {p.name for p in out.iterdir()} - {".posbias-output"} <= D.OUTPUTS
    for name in ("diagnosis.md", "diagnosis.html", "diagnosis.json", "run_info.json", "scores.json",
                 "predictions.json", "score_by_position.png"):
        assert (out / name).is_file(), name
    scores = json.loads((out / "scores.json").read_text())
    q = len(scores["question_ids"])
    assert q == len(QUESTIONS) and scores["positions"] == [1, 2, 3]
    for key in ("loglik/original/loglik", "loglik/reorder/loglik", "loglik/mspoe/logprob",
                "generation/original/accuracy", "generation/mspoe/f1"):
        assert np.asarray(scores[key]).shape == (q, 3), key
    lp = np.asarray(scores["loglik/original/logprob"])
    assert np.all(lp < 0) and np.allclose(np.asarray(scores["loglik/original/loglik"]), 100 * np.exp(lp))
    # reordering by relevance puts the same documents in one order, wherever the gold one started
    assert np.allclose(np.ptp(np.asarray(scores["loglik/reorder/logprob"]), axis=1), 0)
    assert res["prompts_computed"]["loglik, reorder-bm25"] == q
    preds = json.loads((out / "predictions.json").read_text())
    assert set(preds) == {"original", "reorder", "mspoe", "closed_book", "oracle"}
    assert all(len(v) == 3 for v in preds["original"].values()) and all(len(v) == 1 for v in preds["oracle"].values())
    for m in ("loglik", "accuracy", "exact", "f1"):
        assert set(res["verdicts"][m]) == {"original", "reorder", "mspoe"}
        assert set(res["mitigation_effects"][m]) == {"reorder", "mspoe"}
    v = res["verdicts"]["loglik"]["original"]
    assert v["effect"] == pytest.approx(np.mean(100 * np.exp(lp[:, 0])) - np.mean(100 * np.exp(lp[:, -1])))
    h = res["heatmap"]
    assert h["lengths"] == [80]
    # per length, the verdict over depths is paired over the haystacks that have every depth: its curve is
    # the cells' means when every haystack is complete, and shallowest − deepest is their difference
    (hv,) = h["verdicts"]
    cells = h["cells"][0]
    assert hv["length"] == 80 and hv["questions"] == cells[0]["n"] == cells[1]["n"] > 0
    assert [c["score"] for c in hv["curve"]] == pytest.approx([c["score"] for c in cells])
    assert hv["effect"] == pytest.approx(cells[0]["score"] - cells[1]["score"])
    md = (out / "diagnosis.md").read_text()
    assert "Mitigations against the unmodified model" in md and "Depth × length" in md
    assert "shallowest − deepest" in md
    assert res["verdict_lines"][0].startswith("Position diagnosis of tiny-gemma")
    info = json.loads((out / "run_info.json").read_text())
    assert info["command"] == "diagnose generation" and info["k"] == 3 and "versions" in info


def test_a_second_run_reads_every_score_from_the_cache(lm, tmp_path):
    first = run(lm, tmp_path, out="a")
    second = run(lm, tmp_path, out="b")
    assert first["prompts_computed"] and not second["prompts_computed"]
    assert json.loads((tmp_path / "a" / "scores.json").read_text()) == json.loads((tmp_path / "b" / "scores.json").read_text())


def test_batch_tokens_changes_the_batches_not_the_scores(lm, tmp_path):
    """--batch-tokens 1: every prompt in a batch of its own; the scores equal the default batching's,
    and run_info records the batching."""
    wide = run(lm, tmp_path, out="wide", cache_dir=tmp_path / "c1", batch_size=8)
    alone = run(lm, tmp_path, out="alone", cache_dir=tmp_path / "c2", batch_size=8, batch_tokens=1)
    a = json.loads((tmp_path / "wide" / "scores.json").read_text())
    b = json.loads((tmp_path / "alone" / "scores.json").read_text())
    assert a.keys() == b.keys() and wide["prompts_computed"] == alone["prompts_computed"]
    numeric = [key for key in a if "/" in key]
    assert numeric and all(a[key] == b[key] for key in a if key not in numeric)
    for key in numeric:
        assert np.allclose(np.asarray(a[key], dtype=float), np.asarray(b[key], dtype=float), atol=1e-4), key
    info = json.loads((tmp_path / "alone" / "run_info.json").read_text())
    assert (info["batch_size"], info["batch_tokens"], info["max_new_tokens"]) == (8, 1, 3)
    with pytest.raises(ConfigError, match="batch_tokens"):
        run(lm, tmp_path, out="bad", batch_tokens=0)


def test_references_are_the_closed_book_and_gold_alone_prompts_scored_directly(lm, tmp_path):
    """Liu et al.'s references: the closed-book prompt (the question alone) and the gold document alone,
    scored with the unmodified model; their means are the per-question scores' means; --no-references
    leaves them out."""
    from posbias.generation import benchmark as B
    from posbias.generation.scoring import answer_logprobs, encode_prompts

    res = run(lm, tmp_path, scorings=("loglik",))
    scores = json.loads((tmp_path / "diag" / "scores.json").read_text())
    ids = scores["question_ids"]
    found = {qa["id"]: (qa["question"], qa["answers"][0]["text"], B.Document(a["title"], para["context"]))
             for a in json.loads(squad_file(tmp_path).read_text())["data"] for para in a["paragraphs"]
             for qa in para["qas"]}
    for ref, texts in (("closed_book", [f"Question: {found[i][0]}\nAnswer:" for i in ids]),
                       ("oracle", [B.prompt(found[i][0], [found[i][2]]) for i in ids])):
        enc = encode_prompts(lm.tokenizer, texts, [found[i][1] for i in ids])
        lp = answer_logprobs(lm.model, enc, pad_id=lm.tokenizer.pad_token_id, device=lm.device, batch_size=1)
        assert np.allclose(scores[f"loglik/{ref}/logprob"], lp, atol=1e-5), ref
    assert B.closedbook_prompt(found[ids[0]][0]) == f"Question: {found[ids[0]][0]}\nAnswer:"
    ref = res["references"]["loglik"]
    assert ref["closed_book"]["score"] == pytest.approx(np.mean(scores["loglik/closed_book/loglik"]))
    assert ref["oracle"]["score"] == pytest.approx(np.mean(scores["loglik/oracle/loglik"]))
    assert ref["oracle"]["ci"][0] <= ref["oracle"]["score"] <= ref["oracle"]["ci"][1]
    assert "References: no documents, the gold document alone" in (tmp_path / "diag" / "diagnosis.md").read_text()
    assert any(line.strip().startswith("references: closed-book") for line in res["verdict_lines"])
    none = run(lm, tmp_path, out="none", scorings=("loglik",), references=False)
    assert none["references"] == {} and "closed_book" not in json.dumps(none["prompts_computed"])
    assert json.loads((tmp_path / "none" / "run_info.json").read_text())["references"] is False


def test_a_killed_run_keeps_the_scores_it_finished(lm, tmp_path, monkeypatch):
    calls = {"n": 0}
    real = L.answer_logprobs

    def dying(*args, **kw):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(D, "CHUNK", 4)
    monkeypatch.setattr(L, "answer_logprobs", dying)
    with pytest.raises(KeyboardInterrupt):
        run(lm, tmp_path, scorings=("loglik",))
    assert not (tmp_path / "diag").exists()  # no half-written report
    monkeypatch.setattr(L, "answer_logprobs", real)
    res = run(lm, tmp_path, scorings=("loglik",))
    assert res["prompts_computed"]["loglik, original"] == len(QUESTIONS) * 3 - 4  # the first chunk was kept
    (tmp_path / "fresh").mkdir()
    whole = run(lm, tmp_path / "fresh", scorings=("loglik",))
    assert res["verdicts"]["loglik"]["original"]["curve"] == whole["verdicts"]["loglik"]["original"]["curve"]


def test_a_torn_cache_line_is_skipped(tmp_path):
    c = D.ScoreCache(tmp_path, "fp", "fp32", "loglik", float)
    c.add({"a": -1.5, "b": -0.5})
    with open(c.file, "a") as f:
        f.write('{"k": "c", "v": -0.')  # a kill mid-write
    again = D.ScoreCache(tmp_path, "fp", "fp32", "loglik", float)
    assert again.values == {"a": -1.5, "b": -0.5}
    assert D.ScoreCache(tmp_path, "fp", "bf16", "loglik", float).values == {}  # another precision's scores


@pytest.mark.parametrize("kw, match", [
    (dict(k=0), "k must be an integer >= 1"),
    (dict(scorings=("bleu",)), "scorings must be"),
    (dict(mitigations=("reorder", "reorder")), "mitigations must be distinct"),
    (dict(depths=(1.5,)), "depths must be fractions"),
    (dict(mspoe_ratios=(2.0, 1.2)), "mspoe_ratios"),
    (dict(template="nope"), "template must be one of"),
    (dict(chat="on"), "has no chat template"),
])
def test_bad_options_are_refused_in_one_line(lm, tmp_path, kw, match):
    with pytest.raises(ConfigError, match=match) as e:
        run(lm, tmp_path, **kw)
    assert "\n" not in str(e.value)


def test_the_api_and_cli_reach_the_diagnosis_from_a_model_folder(tmp_path):
    tok = tokenizer()
    model = gemma(tok)
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    data = squad_file(tmp_path)
    res = posbias.diagnose(str(folder), str(data), tmp_path / "api", task="generation", k=2, bootstrap_samples=20,
                           min_bucket=2, cache_dir=str(tmp_path / "cache"), device="cpu", precision="fp32",
                           progress=False)
    assert res["k"] == 2 and res["questions"] == len(QUESTIONS)
    cmd = [sys.executable, "-m", "posbias", "--quiet", "diagnose", "generation", "--model", str(folder), "--data", str(data),
           "--output-dir", str(tmp_path / "cli"), "--k", "2", "--bootstrap-samples", "20", "--min-bucket", "2",
           "--cache-dir", str(tmp_path / "cache"), "--device", "cpu", "--precision", "fp32"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "Position diagnosis of" in p.stdout and (tmp_path / "cli" / "diagnosis.md").is_file()
    # the second run read its scores from the cache the API call filled: the same verdict
    cli = json.loads((tmp_path / "cli" / "diagnosis.json").read_text())
    assert cli["verdicts"]["loglik"]["original"]["curve"] == json.loads(json.dumps(
        res["verdicts"]["loglik"]["original"]["curve"]))
    bad = subprocess.run(cmd + ["--k", "0"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr

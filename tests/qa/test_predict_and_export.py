"""Prediction from unlabeled questions (SQuAD JSON without answers, the questions JSONL) and an
exported Hugging Face folder that carries its window and decoding settings."""
import gzip
import json

import pytest

import posbias
from posbias.config import build_config
from posbias.errors import DataError
from posbias.qa.readers import read_qa

from helpers import DEMO_DEV, cli_here, run_cli, tiny_config

QUESTIONS = [
    {"id": "norman", "question": "Who ruled Normandy?", "context": "The Normans ruled Normandy in the 10th century."},
    {"question": "Where did it happen?", "context": "It happened in Paris in 1900, on a Tuesday."},
]


def write_jsonl(path, rows, extra: str = ""):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n" + extra, encoding="utf-8")
    return path


def unlabeled_squad(tmp_path, n: int = 6):
    """The first `n` bundled dev questions as SQuAD JSON with their answers taken out."""
    data = json.loads(gzip.decompress(open(DEMO_DEV, "rb").read()))
    kept, left = [], n
    for article in data["data"]:
        for p in article["paragraphs"]:
            # no answers key, or an empty list: both unlabeled
            qas = [{"id": q["id"], "question": q["question"], **({"answers": []} if i % 2 else {})}
                   for i, q in enumerate(p["qas"][:left])]
            left -= len(qas)
            if qas:
                kept.append({"title": article["title"], "paragraphs": [{"context": p["context"], "qas": qas}]})
        if left <= 0:
            break
    path = tmp_path / "questions.json"
    path.write_text(json.dumps({"version": "1.1", "data": kept}), encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------ readers
def test_the_questions_jsonl_reads_for_prediction_only(tmp_path):
    path = write_jsonl(tmp_path / "q.jsonl", QUESTIONS, extra="\n")  # a trailing blank line is skipped
    ds = read_qa(path, labeled=False)
    assert ds.format == "questions" and [e.id for e in ds.examples] == ["norman", "line-2"]
    assert ds.examples[1].context.startswith("It happened") and ds.examples[0].answers == []
    with pytest.raises(DataError, match="is for `posbias predict`; evaluation needs gold answers"):
        read_qa(path)


@pytest.mark.parametrize("line, reason", [
    ("{not json", "not valid JSON"),
    ('["a list"]', "must be a JSON object"),
    ('{"question": "Who?"}', "context must be a non-empty string"),
    ('{"question": " ", "context": "x"}', "question must be a non-empty string"),
    ('{"id": 7, "question": "Who?", "context": "x"}', "id must be a non-empty string"),
    ('{"id": "norman", "question": "Who?", "context": "x"}', "duplicate id"),
])
def test_a_bad_questions_line_names_the_file_and_the_line(tmp_path, line, reason):
    path = write_jsonl(tmp_path / "q.jsonl", QUESTIONS, extra=line + "\n")
    with pytest.raises(DataError, match=rf"q\.jsonl: record 'line 3': {reason}"):
        read_qa(path, labeled=False)
    ds = read_qa(path, "skip", labeled=False)
    assert len(ds.examples) == 2 and ds.skipped[0][0] == "line 3"


def test_squad_questions_without_answers_read_for_prediction_not_for_evaluation(tmp_path):
    path = unlabeled_squad(tmp_path)
    ds = read_qa(path, labeled=False)
    assert len(ds.examples) == 6 and all(e.answers == [] and not e.is_impossible for e in ds.examples)
    with pytest.raises(DataError, match="answers must be a list, got None|answerable question has no answers"):
        read_qa(path)


# ------------------------------------------------------------------------------------------ a model
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny v1 model whose windows (96 tokens, stride 32) and decoding (answers of <= 8 tokens, 5
    candidates) differ from posbias's defaults."""
    out = tmp_path_factory.mktemp("predict")
    cfg = build_config(tiny_config(out, data={"max_seq_len": 96, "stride": 32, "max_query_len": 24},
                                   decode={"max_answer_len": 8, "n_best": 5}, train={"max_steps": 4}))
    posbias.train(cfg, progress=False)
    return out / "run" / "best"


def test_predict_answers_unlabeled_squad_and_questions_jsonl(trained, tmp_path):
    squad = posbias.predict(trained, data=unlabeled_squad(tmp_path))
    assert len(squad) == 6 and all(v["answer"] for v in squad.values())
    lines = write_jsonl(tmp_path / "q.jsonl", QUESTIONS)
    r = cli_here("predict", "qa", "--model", str(trained), "--data", str(lines), "--output-dir", str(tmp_path / "p"))
    assert r.returncode == 0, r.stderr[-2000:]
    preds = json.loads((tmp_path / "p" / "predictions.json").read_text(encoding="utf-8"))
    assert set(preds) == {"norman", "line-2"} and preds["norman"] in QUESTIONS[0]["context"]


def test_predict_on_a_bad_questions_line_is_one_line_exit_2(trained, tmp_path):
    lines = write_jsonl(tmp_path / "q.jsonl", QUESTIONS, extra='{"question": "Who?"}\n')
    r = cli_here("predict", "qa", "--model", str(trained), "--data", str(lines))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].endswith(
        f"{lines}: record 'line 3': context must be a non-empty string, got None")


def test_an_exported_folder_answers_as_its_checkpoint(trained, tmp_path):
    """The folder carries the windows and decoding it was trained with (posbias.json, and config.json's
    task_specific_params for transformers' users): posbias reads them, no override needed."""
    from transformers import AutoConfig, AutoModelForQuestionAnswering

    out = posbias.export(trained, tmp_path / "hf")
    settings = json.loads((out / "posbias.json").read_text(encoding="utf-8"))
    assert settings["task"] == "qa" and settings["model"] == {"null_answer": False}
    assert settings["data"] == {"max_seq_len": 96, "stride": 32, "max_query_len": 24, "context_first": "auto"}
    assert settings["decode"]["max_answer_len"] == 8 and settings["decode"]["n_best"] == 5
    params = AutoConfig.from_pretrained(str(out)).task_specific_params["question-answering"]
    assert params == {"max_seq_len": 96, "doc_stride": 32, "max_question_len": 24, "max_answer_len": 8,
                      "handle_impossible_answer": False}
    _, info = AutoModelForQuestionAnswering.from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    a = posbias.predict(trained, data=DEMO_DEV, overrides=["data.max_eval_examples=40"])
    b = posbias.predict(out, data=DEMO_DEV, overrides=["data.max_eval_examples=40"])
    assert {k: v["answer"] for k, v in a.items()} == {k: v["answer"] for k, v in b.items()}
    assert all(len(v["nbest"]) <= 5 for v in b.values())
    ev_a = posbias.evaluate(trained, DEMO_DEV, overrides=["data.max_eval_examples=40"], progress=False)
    ev_b = posbias.evaluate(out, DEMO_DEV, overrides=["data.max_eval_examples=40"], progress=False)
    assert ev_b["f1"] == pytest.approx(ev_a["f1"]) and ev_b["windows"] == ev_a["windows"]
    # Without the file the folder reads with posbias's defaults (384-token windows, "no answer" allowed).
    (out / "posbias.json").unlink()
    ev_c = posbias.evaluate(out, DEMO_DEV, overrides=["data.max_eval_examples=40"], progress=False)
    assert ev_c["windows"] != ev_a["windows"]

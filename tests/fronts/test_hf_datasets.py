"""Hugging Face `datasets` objects wherever the API takes data: training, evaluation, diagnosis, for
both tasks, built in memory (no download); the same numbers as the equivalent files."""
import json

import pytest

datasets = pytest.importorskip("datasets")

import posbias  # noqa: E402
from posbias.errors import ConfigError, DataError  # noqa: E402
from posbias.qa.readers import read_qa  # noqa: E402

from helpers import DEMO_DEV, TINY_ENCODER  # noqa: E402

LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
SENTENCES = [(["Ana", "went", "to", "Oslo"], ["B-PER", "O", "O", "B-LOC"]),
             (["Bo", "Berg", "smiled", "in", "New", "York"], ["B-PER", "I-PER", "O", "O", "B-LOC", "I-LOC"]),
             (["It", "rained"], ["O", "O"])] * 4


def ner_dataset(sentences=SENTENCES):
    features = datasets.Features({"tokens": datasets.Sequence(datasets.Value("string")),
                                  "ner_tags": datasets.Sequence(datasets.ClassLabel(names=LABELS))})
    return datasets.Dataset.from_dict({"tokens": [w for w, _ in sentences],
                                       "ner_tags": [[LABELS.index(t) for t in ts] for _, ts in sentences]},
                                      features=features)


def tagging_config(tmp_path):
    return {"task": "tagging", "model": {"name_or_path": None, "tokenizer": "tiny", "encoder": dict(TINY_ENCODER)},
            "data": {"train_file": None, "eval_file": None},
            "train": {"output_dir": str(tmp_path / "run"), "max_steps": 2, "batch_size": 4}}


def test_tagging_train_evaluate_diagnose_from_datasets(tmp_path):
    dd = datasets.DatasetDict({"train": ner_dataset(), "validation": ner_dataset(SENTENCES[:3])})
    summary = posbias.train(tagging_config(tmp_path), data=dd, progress=False)
    assert summary["steps"] == 2 and summary["eval"]["entities"] == 4  # evaluated on the validation split
    cfg = json.loads(json.dumps(__import__("yaml").safe_load((tmp_path / "run" / "config.yaml").read_text())))
    assert cfg["data"]["train_file"].startswith("datasets:") and "12 rows" in cfg["data"]["train_file"]
    best = str(tmp_path / "run" / "best")
    conll = tmp_path / "dev.conll"
    conll.write_text("\n\n".join("\n".join(f"{w} {t}" for w, t in zip(*s)) for s in SENTENCES[:3]) + "\n",
                     encoding="utf-8")
    from_ds = posbias.evaluate(best, ner_dataset(SENTENCES[:3]), task="tagging", progress=False)
    from_file = posbias.evaluate(best, str(conll), task="tagging", progress=False)
    assert {k: from_ds[k] for k in ("f1", "entities", "predicted_entities")} == \
           {k: from_file[k] for k in ("f1", "entities", "predicted_entities")}
    res = posbias.diagnose(best, ner_dataset(), tmp_path / "diag", task="tagging", k_max=2, quantiles=None,
                           progress=False)
    assert res["subset"]["evaluated_sentences"] == 12 and (tmp_path / "diag" / "diagnosis.html").is_file()


def test_dataset_errors_name_the_row_or_the_splits():
    bad = datasets.Dataset.from_dict({"tokens": [["Ana", "went"], ["Bo"]], "ner_tags": [["B-PER", "O"], ["O", "O"]]})
    from posbias.tagging.readers import read_tagging_dataset

    with pytest.raises(DataError, match=r"datasets:in-memory\(2 rows.*record 'row 1': 1 words but 2 tags"):
        read_tagging_dataset(bad)
    with pytest.raises(DataError, match="record 'row 1': .*prefix 'Q'"):
        read_tagging_dataset(datasets.Dataset.from_dict({"tokens": [["a"], ["b"]], "ner_tags": [["O"], ["Q-PER"]]}))
    with pytest.raises(ConfigError, match=r"no tag column .*columns: \['tokens', 'x'\]"):
        read_tagging_dataset(datasets.Dataset.from_dict({"tokens": [["a"]], "x": [["O"]]}))
    dd = datasets.DatasetDict({"validation": ner_dataset(), "test": ner_dataset()})
    with pytest.raises(ConfigError, match=r"splits \['validation', 'test'\]; pass one"):
        read_tagging_dataset(dd)


def test_a_dataset_column_holding_the_models_tags_is_named():
    """HF's conll2003 has pos_tags, chunk_tags and ner_tags; a POS model reads ner_tags by default."""
    from posbias.tagging.readers import read_tagging_dataset
    from posbias.tagging.evaluate import align_labels

    pos = ["NNP", "VBD", "TO", "NN"]
    features = datasets.Features({"tokens": datasets.Sequence(datasets.Value("string")),
                                  "pos_tags": datasets.Sequence(datasets.ClassLabel(names=pos)),
                                  "ner_tags": datasets.Sequence(datasets.ClassLabel(names=LABELS))})
    ds = datasets.Dataset.from_dict({"tokens": [["Ana", "went", "to", "Oslo"]], "pos_tags": [[0, 1, 2, 0]],
                                     "ner_tags": [[1, 0, 0, 3]]}, features=features)
    with pytest.raises(ConfigError, match=r"the dataset's column 'pos_tags' \(NNP, VBD, TO\) holds the model's tags: "
                                          r"set data\.tags_column=pos_tags$"):
        align_labels(read_tagging_dataset(ds), pos, "none", None)
    align_labels(read_tagging_dataset(ds, tags_column="pos_tags"), pos, "none", None)  # read right: no error
    align_labels(read_tagging_dataset(ds), LABELS, "iob2", None)
    with pytest.raises(ConfigError, match=r"no column 'pos_tag' \(tag\); did you mean 'pos_tags'\?$"):
        read_tagging_dataset(ds, tags_column="pos_tag")


def squad_dataset(examples):
    return datasets.Dataset.from_dict({
        "id": [e.id for e in examples], "title": [e.title for e in examples], "context": [e.context for e in examples],
        "question": [e.question for e in examples],
        "answers": [{"text": [a.text for a in e.answers], "answer_start": [a.start for a in e.answers]} for e in examples]})


def test_qa_evaluate_and_diagnose_a_dataset_as_the_file(tmp_path):
    from helpers import tiny_config

    examples = read_qa(DEMO_DEV).examples[:30]
    posbias.train(tiny_config(tmp_path, train={"max_steps": 1}), progress=False)
    best = str(tmp_path / "run" / "best")
    over = ["data.max_eval_examples=30"]
    from_file = posbias.evaluate(best, DEMO_DEV, overrides=over, progress=False)
    from_ds = posbias.evaluate(best, squad_dataset(examples), progress=False)
    assert from_ds["total"] == 30 and from_ds["f1"] == pytest.approx(from_file["f1"])
    res = posbias.diagnose(best, squad_dataset(examples), tmp_path / "diag", progress=False)
    assert res["metrics"]["total"] == 30 and (tmp_path / "diag" / "diagnosis.html").is_file()

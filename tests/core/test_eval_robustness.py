"""evaluate / predict / diagnose / score on bad input: one named error (exit 2), never a traceback,
and never a half-written or mixed output folder."""
import json

import pytest

import posbias
from posbias.cli import main
from posbias.config import build_config
from posbias.errors import ConfigError, DataError, PosbiasError
from posbias.outputs import write_marker

from helpers import DEMO_DEV, cli_here, save_tiny_checkpoints

WORDS = ["the", "cat", "sat", "on", "the", "mat"] * 120  # 720 words: more tokens than the 512 positions


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny random QA checkpoint (SQuAD v1: no null answer) and a tiny tagging checkpoint."""
    return save_tiny_checkpoints(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def long_data(tmp_path_factory):
    """One QA question and one tagged sentence longer than the encoders' position table."""
    root = tmp_path_factory.mktemp("long")
    context = " ".join(WORDS) + " Paris is the answer."
    qa = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": context, "qas": [
        {"id": "q1", "question": "Where?", "answers": [{"text": "Paris", "answer_start": context.index("Paris")}]}]}]}]}
    (root / "long.json").write_text(json.dumps(qa), encoding="utf-8")
    (root / "long.conll").write_text("".join(f"{w}\tO\n" for w in WORDS) + "\nParis\tB-person\n", encoding="utf-8")
    return {"qa": str(root / "long.json"), "tagging": str(root / "long.conll")}


# ---- data.max_seq_len is checked against the position table, as training checks it

LONG = ["data.max_seq_len=1024"]
TOO_LONG = r"data.max_seq_len \(1024\) \+ first position id \(0\) exceeds the encoder's max_position_embeddings \(512\)"


@pytest.mark.parametrize("call", [
    lambda m, d, out: posbias.evaluate(m["qa"], d["qa"], overrides=LONG, progress=False),
    lambda m, d, out: posbias.evaluate(m["tagging"], d["tagging"], overrides=LONG, progress=False),
    lambda m, d, out: posbias.predict(m["qa"], question="Where?", context=" ".join(WORDS), overrides=LONG),
    lambda m, d, out: posbias.predict(m["tagging"], data=d["tagging"], overrides=LONG),
    lambda m, d, out: posbias.diagnose(m["qa"], d["qa"], out, overrides=LONG, progress=False),
    lambda m, d, out: posbias.diagnose(m["tagging"], d["tagging"], out, overrides=LONG, progress=False, k_max=2,
                                       quantiles=None),
], ids=["evaluate-qa", "evaluate-tagging", "predict-qa", "predict-tagging", "diagnose-qa", "diagnose-tagging"])
def test_max_seq_len_beyond_the_position_table_is_refused(models, long_data, tmp_path, call):
    with pytest.raises(ConfigError, match=TOO_LONG):
        call(models, long_data, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []  # neither the folder nor its temporary sibling


def test_check_max_seq_len_allows_the_whole_table(models):
    from posbias.checkpoint import check_max_seq_len, load_checkpoint

    net, _, cfg = load_checkpoint(models["qa"])
    check_max_seq_len(net, build_config(cfg.to_dict(), ["data.max_seq_len=512"]))
    with pytest.raises(ConfigError, match=r"data.max_seq_len \(513\)"):
        check_max_seq_len(net, build_config(cfg.to_dict(), ["data.max_seq_len=513"]))


def test_cli_evaluate_tagging_long_max_seq_len_is_one_line(models, long_data):
    r = cli_here("evaluate", "tagging", "--model", models["tagging"], "--data", long_data["tagging"],
                 "data.max_seq_len=1024")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [f"posbias: error: {TOO_LONG}".replace("\\", "")]


# ---- outputs go through a temporary folder: a failed run leaves the previous outputs untouched

def _old_outputs(folder):
    """A previous output of posbias: its files and its marker (`posbias.outputs`)."""
    folder.mkdir()
    write_marker(folder, "evaluate")
    for name in ("predictions.json", "nbest.json", "metrics.json", "run_info.json"):
        (folder / name).write_text('{"old": true}\n', encoding="utf-8")
    return {p.name: p.read_text(encoding="utf-8") for p in folder.iterdir()}


def _files(folder):
    return {p.name: p.read_text(encoding="utf-8") for p in folder.iterdir() if p.is_file()}


def _killed(*args, **kw):
    raise KeyboardInterrupt


def test_evaluate_killed_mid_write_keeps_the_previous_outputs(models, tmp_path, monkeypatch):
    out = tmp_path / "ev"
    before = _old_outputs(out)
    # run_info.json is written after predictions.json, nbest.json and metrics.json
    monkeypatch.setattr("posbias.evaluation.write_run_meta", _killed)
    with pytest.raises(KeyboardInterrupt):
        posbias.evaluate(models["qa"], DEMO_DEV, out, overrides=["data.max_eval_examples=4"], progress=False)
    assert _files(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ev"]


def test_diagnose_qa_failing_after_its_evaluation_keeps_the_previous_outputs(models, tmp_path, monkeypatch):
    out = tmp_path / "dq"
    before = _old_outputs(out)
    monkeypatch.setattr("posbias.qa.diagnose.plot_position_curve", _killed)
    with pytest.raises(KeyboardInterrupt):
        posbias.diagnose(models["qa"], DEMO_DEV, out, overrides=["data.max_eval_examples=4"], progress=False)
    assert _files(out) == before and not (out / "eval").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dq"]


def test_predict_tagging_failing_mid_write_keeps_the_previous_outputs(models, tmp_path, monkeypatch):
    out = tmp_path / "pt"
    before = _old_outputs(out)
    monkeypatch.setattr("posbias.tagging.evaluate.write_run_meta", _killed)
    with pytest.raises(KeyboardInterrupt):
        posbias.predict(models["tagging"], data="demo:wnut-dev", output_dir=out)
    assert _files(out) == before


def test_a_finished_run_replaces_the_whole_output_set(models, tmp_path):
    out = tmp_path / "ev"
    _old_outputs(out)
    posbias.evaluate(models["tagging"], "demo:wnut-dev", out, overrides=["data.max_eval_examples=5"], progress=False)
    # No nbest.json / predictions.json of the previous (QA) run beside the new tagging outputs.
    assert sorted(_files(out)) == [".posbias-output", "config.yaml", "metrics.json", "predictions.conll", "run_info.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ev"]


def test_a_folder_with_other_files_is_not_replaced(models, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"mine: the output folder holds 'notes.txt'"):
        posbias.predict(models["qa"], question="Who?", context="Ann met Bob.", output_dir=out)
    assert _files(out) == {"notes.txt": "keep me"}


def test_the_working_folder_is_not_an_output_folder(models, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="holds the working folder"):
        posbias.predict(models["qa"], question="Who?", context="Ann met Bob.", output_dir=".")


# ---- unusable output folders, missing files, pathological JSON, mismatched models, bad options

def test_output_dir_that_is_a_file_or_under_one(models, tmp_path):
    (tmp_path / "afile").write_text("x", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"afile: the output folder is an existing file"):
        posbias.evaluate(models["qa"], DEMO_DEV, tmp_path / "afile", overrides=["data.max_eval_examples=2"],
                         progress=False)
    with pytest.raises(ConfigError, match=r"afile/sub: cannot create the output folder \(Not a directory\)"):
        posbias.diagnose(models["tagging"], "demo:wnut-dev", tmp_path / "afile" / "sub", progress=False)
    assert (tmp_path / "afile").read_text(encoding="utf-8") == "x"


def test_cli_predict_into_a_file_is_one_line(models, tmp_path, capsys):
    (tmp_path / "afile").write_text("x", encoding="utf-8")
    code = main(["predict", "qa", "--model", models["qa"], "--question", "Who?", "--context", "Ann met Bob.",
                 "--output-dir", str(tmp_path / "afile")])
    assert code == 2
    assert capsys.readouterr().err == f"posbias: error: {tmp_path / 'afile'}: the output folder is an existing file; " \
                                      "give a folder path\n"


def test_cli_score_qa_missing_predictions(tmp_path):
    r = cli_here("score", "qa", "--data", DEMO_DEV, "--predictions", str(tmp_path / "nope.json"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"{tmp_path / 'nope.json'}: cannot read file: no such file" in r.stderr


def test_score_qa_missing_na_probs(tmp_path):
    (tmp_path / "p.json").write_text("{}", encoding="utf-8")
    with pytest.raises(DataError, match=r"na\.json: cannot read file: no such file"):
        posbias.score(DEMO_DEV, tmp_path / "p.json", na_probs=tmp_path / "na.json", version="2.0")


def test_deeply_nested_json_is_a_data_error(models, tmp_path):
    from posbias.qa.readers import read_qa

    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000, encoding="utf-8")
    with pytest.raises(DataError, match=r"deep\.json: not valid SQuAD JSON: arrays or objects nested too deeply"):
        posbias.evaluate(models["qa"], str(deep), progress=False)
    mrqa = tmp_path / "deep.jsonl"
    mrqa.write_text('{"header": {"dataset": "X"}}\n' + "[" * 100_000 + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"deep\.jsonl: record 'line 2': not valid MRQA JSON"):
        read_qa(mrqa)


def test_v1_model_on_unanswerable_questions(models, tmp_path):
    data = tmp_path / "v2.json"
    data.write_text(json.dumps({"version": "v2.0", "data": [{"title": "t", "paragraphs": [{
        "context": "Some text here.", "qas": [
            {"id": "u1", "question": "What?", "answers": [], "is_impossible": True}]}]}]}), encoding="utf-8")
    with pytest.raises(DataError, match=r"v2\.json: record 'u1': question is unanswerable .* no null answer"):
        posbias.evaluate(models["qa"], str(data), progress=False)


def test_n_best_below_one_is_refused(models, capsys):
    with pytest.raises(PosbiasError, match=r"--n-best must be >= 1, got -3"):
        posbias.predict(models["qa"], question="Who?", context="Ann met Bob.", n_best=-3)
    with pytest.raises(SystemExit) as exit_:  # the CLI refuses it while parsing the arguments
        main(["predict", "qa", "--model", models["qa"], "--question", "Who?", "--context", "Ann met Bob.",
              "--n-best", "0"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines() == ["posbias: error: argument --n-best: must be an integer >= 1, "
                                                    "got 0 (see: posbias predict qa --help)"]

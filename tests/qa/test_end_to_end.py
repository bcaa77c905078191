"""train -> evaluate -> predict -> score -> export, resume, CLI behaviour, multi-process training."""
import json
import os
import socket
import subprocess

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file

import posbias
from posbias.cli import SUBCOMMANDS
from posbias.config import build_config

from helpers import BIN, DEMO_DEV, INTERRUPT, cli_here, demo_v2_file, relative_error, run_cli, tiny_config



@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One tiny training run shared by the tests that only read its outputs."""
    out = tmp_path_factory.mktemp("e2e")
    cfg = build_config(tiny_config(out, train={"max_steps": 4, "eval_every": 2}))
    summary = posbias.train(cfg, progress=False)
    return out / "run", summary


def test_train_writes_its_files(trained):
    run, summary = trained
    for f in ["config.yaml", "run_info.json", "train_log.jsonl", "eval_log.jsonl", "data_order/epoch-0.json",
              "best/model.safetensors", "best/tokenizer.json", "best/posbias.yaml", "best/config.json",
              "checkpoints/last/training_state.safetensors", "eval/predictions.json", "eval/nbest.json",
              "eval/null_odds.json", "eval/metrics.json"]:
        assert (run / f).is_file(), f
    info = json.loads((run / "run_info.json").read_text(encoding="utf-8"))
    assert info["status"] == "finished" and info["seed"] == 42 and "torch" in info["versions"]
    assert [json.loads(l)["step"] for l in (run / "eval_log.jsonl").read_text(encoding="utf-8").splitlines()] == [2, 4]
    log = [json.loads(l) for l in (run / "train_log.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4] and all(r["tokens_per_s"] > 0 for r in log)
    preds = json.loads((run / "eval/predictions.json").read_text(encoding="utf-8"))
    assert len(preds) == 24 and summary["eval"]["total"] == 24
    assert summary["best_step"] in (2, 4)
    order = json.loads((run / "data_order/epoch-0.json").read_text(encoding="utf-8"))
    assert len(order["batches"]) == len(order["windows"]) and len(order["batches"][0]) == 8


def test_evaluate_predict_score_roundtrip(trained, tmp_path):
    run, summary = trained
    res = posbias.evaluate(run / "best", DEMO_DEV, tmp_path / "ev",
                           overrides=["data.max_eval_examples=24"], progress=False)
    # Same weights, same data, same decoding as the in-training evaluation of the best step.
    assert res["f1"] == pytest.approx(summary["best_f1"])
    scored = posbias.score(DEMO_DEV, tmp_path / "ev" / "predictions.json")
    # The official script averages over all questions of the file: 24 predicted of 433.
    assert scored["missing"] == 433 - 24
    assert scored["f1"] == pytest.approx(res["f1"] * 24 / 433)
    ans = posbias.predict(run / "best", question="Who ruled?", context="The Normans ruled Normandy.")
    a = ans["q0"]
    assert a["answer"] in "The Normans ruled Normandy." and a["answer"]
    assert 0 < a["probability"] <= 1 and a["start_char"] >= 0


def test_cli_predict_and_score(trained, tmp_path):
    run, _ = trained
    r = cli_here("predict", "qa", "--model", str(run / "best"), "--question", "Where?",
                 "--context", "It happened in Paris in 1900.")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["answer"] and out["answer"] in "It happened in Paris in 1900."
    r = cli_here("score", "qa", "--data", DEMO_DEV, "--predictions", str(run / "eval" / "predictions.json"))
    assert r.returncode == 0, r.stderr
    assert set(json.loads(r.stdout)) >= {"exact_match", "f1"}


def test_help_lists_subcommands():
    r = run_cli("--help")
    assert r.returncode == 0
    for name in SUBCOMMANDS:
        assert name in r.stdout


@pytest.mark.parametrize("command, tasks", [("train", {"qa", "tagging"}), ("evaluate", {"qa", "tagging"}),
                                            ("predict", {"qa", "tagging"}), ("score", {"qa", "tagging"}),
                                            ("diagnose", {"qa", "tagging", "retrieval", "generation"})])
def test_cli_task_subcommands(command, tasks):
    """Commands that depend on the task take it first; their help lists the tasks."""
    from posbias.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    assert set(next(a for a in sub._actions if a.dest == "task").choices) == tasks


@pytest.mark.parametrize("args, message", [
    (["train", "qa", "-c", "tiny", "train.no_such_key=1"], "unknown config key train.no_such_key"),
    (["train", "qa", "-c", "no_such_preset"], "neither a file nor a preset"),
    (["evaluate", "qa", "--model", "/nonexistent", "--data", DEMO_DEV], "is not a model folder"),
])
def test_cli_errors_are_one_line(args, message):
    r = cli_here(*args)
    assert r.returncode == 2
    assert message in r.stderr and "Traceback" not in r.stderr


def test_cli_bad_data_names_file_and_record(trained, tmp_path):
    run, _ = trained
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"version": "1.1", "data": [{"title": "T", "paragraphs": [{
        "context": "Some text.", "qas": [{"id": "q-bad", "question": "What?",
                                           "answers": [{"text": "nothing", "answer_start": 0}]}]}]}]}))
    r = cli_here("evaluate", "qa", "--model", str(run / "best"), "--data", str(bad))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert str(bad) in r.stderr and "q-bad" in r.stderr


def test_refuses_to_overwrite_a_run(trained):
    run, _ = trained
    cfg = build_config(tiny_config(run.parent))
    with pytest.raises(posbias.errors.ConfigError, match="already holds a run"):
        posbias.train(cfg, progress=False)


# ---- resume: an interrupted run continues from its last checkpoint and ends where an
# uninterrupted run ends (same weights), because data order, dropout RNG and schedule are restored.


def test_resume_continues_from_saved_step(tmp_path):
    sections = dict(train={"max_steps": 5, "save_every": 1}, data={"eval_file": None})
    cfg = build_config(tiny_config(tmp_path, **sections) | {"perturb": [{"name": "_test_interrupt"}]})
    INTERRUPT.update(at=3, calls=0)  # dies inside step 3, after steps 1-2 were checkpointed
    with pytest.raises(KeyboardInterrupt):
        posbias.train(cfg, progress=False)
    run = tmp_path / "run"
    assert json.loads((run / "checkpoints/last/trainer_state.json").read_text(encoding="utf-8"))["global_step"] == 2
    assert not (run / "checkpoints/last.tmp").exists()
    with open(run / "train_log.jsonl", "a", encoding="utf-8") as f:  # a line past the checkpoint and a cut-off one
        f.write(json.dumps({"step": 3, "loss": 1.0}) + "\n" + '{"step": 4, "lo')
    INTERRUPT.update(at=None, calls=0)
    summary = posbias.train(cfg, resume="auto", progress=False)
    assert summary["steps"] == 5 and INTERRUPT["calls"] == 3  # only steps 3, 4, 5 ran
    steps = [json.loads(l)["step"] for l in (run / "train_log.jsonl").read_text(encoding="utf-8").splitlines()]
    assert steps == [1, 2, 3, 4, 5]

    fresh = build_config(cfg.to_dict() | {"train": {**cfg.to_dict()["train"], "output_dir": str(tmp_path / "b")}})
    posbias.train(fresh, progress=False)
    a = load_file(str(run / "best" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "best" / "model.safetensors"))
    # Exact equality is portable here: both runs execute the same kernels on the same machine in one
    # process with one thread (conftest), so a resumed run must reproduce the uninterrupted one bit
    # for bit; any difference means state (weights, optimizer, RNG, data order) was lost.
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)


def test_resume_refuses_a_changed_config(trained):
    run, _ = trained
    cfg = build_config(yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8")))
    changed = build_config(cfg.to_dict() | {"train": {**cfg.to_dict()["train"], "lr": 0.5}})
    with pytest.raises(posbias.errors.ConfigError, match="train.lr changed"):
        posbias.train(changed, resume="auto", progress=False)


def test_resume_refuses_a_switched_off_debias(tmp_path):
    from posbias.config import save_config
    from posbias.training import _check_resume

    d = tiny_config(tmp_path)
    on = build_config({**d, "train": {**d["train"], "debias": {"method": "bias_product"}}})
    save_config(on, tmp_path / "posbias.yaml")
    _check_resume(on, tmp_path)  # unchanged: resumes
    with pytest.raises(posbias.errors.ConfigError, match=r"train.debias changed \(\{'method': 'bias_product'.* -> None\)"):
        _check_resume(build_config(d), tmp_path)


def test_export_to_hugging_face_qa_model(trained, tmp_path):
    from transformers import AutoModelForQuestionAnswering

    from posbias.qa.collate import collate
    from posbias.qa.features import build_qa_features
    from posbias.qa.readers import read_qa
    from posbias.checkpoint import load_checkpoint

    run, _ = trained
    out = posbias.export(run / "best", tmp_path / "hf")
    hf, info = AutoModelForQuestionAnswering.from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    ours, tok, _ = load_checkpoint(run / "best")
    examples = read_qa(DEMO_DEV).examples[:6]
    feats = build_qa_features(examples, tok, max_seq_len=128, stride=48, max_query_len=32)
    batch = collate(feats, np.arange(len(feats)), pad_id=tok.pad_token_id)
    ctx = batch["span_mask"]
    with torch.no_grad():  # float64: the claim is equality, made sharp on any CPU
        mine = ours.eval().double()(batch)
        theirs = hf.eval().double()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                    token_type_ids=batch["token_type_ids"])
        no_types = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    for k in ("start_logits", "end_logits"):
        assert relative_error(mine[k][ctx], getattr(theirs, k)[ctx]) < 1e-10, k
        # The comparison can fail: dropping the segment ids (a classic export bug) is caught.
        assert relative_error(mine[k][ctx], getattr(no_types, k)[ctx]) > 1e-3, k
    # The exported folder is itself a checkpoint posbias can evaluate: same answers.
    a = posbias.predict(run / "best", data=DEMO_DEV, overrides=["data.max_seq_len=128", "data.stride=48"])
    b = posbias.predict(out, data=DEMO_DEV, overrides=["data.max_seq_len=128", "data.stride=48"])
    assert {k: v["answer"] for k, v in a.items()} == {k: v["answer"] for k, v in b.items()}


def test_hf_qa_folder_without_its_head_weights_warns(trained, tmp_path):
    """A Hugging Face QA folder whose qa_outputs weights are missing would be scored with a random
    head: loading it says so instead of evaluating silently."""
    from safetensors.torch import save_file

    from posbias.checkpoint import load_checkpoint

    run, _ = trained
    out = posbias.export(run / "best", tmp_path / "hf")
    weights = out / "model.safetensors"
    state = {k: v for k, v in load_file(str(weights)).items() if not k.startswith("qa_outputs")}
    save_file(state, str(weights), metadata={"format": "pt"})
    with pytest.warns(UserWarning, match=r"checkpoint: 2 weight\(s\) .*qa_outputs"):
        load_checkpoint(out)


@pytest.mark.slow
def test_two_process_training_with_torchrun(tmp_path):
    """Two CPU processes (gloo) through torchrun: both ranks train, rank 0 writes the outputs."""
    cfg = tiny_config(tmp_path, train={"max_steps": 3, "eval_every": 3})
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    with socket.socket() as sock:  # a free port for the rendezvous
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    r = subprocess.run([str(BIN / "torchrun"), "--nproc_per_node", "2", "--master_port", str(port),
                        "-m", "posbias", "train", "qa", "-c", str(path)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    info = json.loads((tmp_path / "run" / "run_info.json").read_text(encoding="utf-8"))
    assert info["world_size"] == 2 and info["status"] == "finished"
    assert info["summary"]["steps"] == 3
    metrics = json.loads((tmp_path / "run" / "eval" / "metrics.json").read_text(encoding="utf-8"))
    assert metrics["total"] == 24  # both ranks' halves of the windows were gathered


def test_squad_v2_end_to_end(tmp_path):
    """Unanswerable questions switch on the null answer: [CLS] labels, null odds, v2 metrics."""
    path, examples = demo_v2_file(tmp_path, 60)
    cfg = build_config(tiny_config(tmp_path, data={"train_file": str(path), "eval_file": str(path),
                                                   "max_train_examples": None, "max_eval_examples": None}))
    summary = posbias.train(cfg, progress=False)
    ev = summary["eval"]
    assert ev["NoAns_total"] == 20 and ev["HasAns_total"] == 40 and "best_f1_thresh" in ev
    info = json.loads((tmp_path / "run" / "run_info.json").read_text(encoding="utf-8"))
    assert info["data_version"] == 2 and info["train_features"]["windows_labelled_null"] >= 20
    odds = json.loads((tmp_path / "run" / "eval" / "null_odds.json").read_text(encoding="utf-8"))
    assert len(odds) == 60 and all(isinstance(v, float) for v in odds.values())
    nbest = json.loads((tmp_path / "run" / "eval" / "nbest.json").read_text(encoding="utf-8"))
    preds = json.loads((tmp_path / "run" / "eval" / "predictions.json").read_text(encoding="utf-8"))
    for qid, cands in nbest.items():
        # The null answer competes in the n-best list: listed unless 20 spans outscore it.
        assert any(c["text"] == "" for c in cands) or len(cands) == cfg.decode.n_best
        if preds[qid] == "" and odds[qid] > 0:
            assert cands[0]["text"] == ""

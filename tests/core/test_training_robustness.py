"""Issue 27: resume state without pickle, crash points of a checkpoint save, numeric config checks,
a NaN loss stopping the run, output folders that cannot be written, non-CoNLL input."""
import gzip
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

import posbias
from posbias.config import build_config
from posbias.errors import ConfigError, DataError, TrainingError
from posbias.tagging.conll import read_conll

from helpers import DEMO_DEV, INTERRUPT, cli_here, run_cli, tiny_config

SECTIONS = dict(train={"max_steps": 5, "save_every": 1}, data={"eval_file": None})


def _interrupted_run(tmp_path, name="run"):
    """A tiny run killed inside step 3, with steps 1-2 checkpointed (checkpoints/last = step 2)."""
    d = tiny_config(tmp_path, **SECTIONS)
    d["train"]["output_dir"] = str(tmp_path / name)
    cfg = build_config(d | {"perturb": [{"name": "_test_interrupt"}]})
    INTERRUPT.update(at=3, calls=0)
    with pytest.raises(KeyboardInterrupt):
        posbias.train(cfg, progress=False)
    INTERRUPT.update(at=None, calls=0)
    return cfg, tmp_path / name


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The same run uninterrupted: the weights every resumed run must end with."""
    tmp = tmp_path_factory.mktemp("ref")
    cfg = build_config(tiny_config(tmp, **SECTIONS) | {"perturb": [{"name": "_test_interrupt"}]})
    INTERRUPT.update(at=None, calls=0)
    posbias.train(cfg, progress=False)
    return load_file(str(tmp / "run" / "best" / "model.safetensors"))


def _assert_same_weights(run, reference):
    got = load_file(str(run / "best" / "model.safetensors"))
    # Same kernels, one process, one thread (conftest): a resumed run reproduces the uninterrupted
    # one bit for bit; any difference means optimizer, RNG or data-order state was lost.
    for k in reference:
        torch.testing.assert_close(got[k], reference[k], rtol=0, atol=0)


# ---- 1. resume state: safetensors + JSON, no pickle

def test_checkpoint_resume_state_has_no_pickle(tmp_path, reference):
    cfg, run = _interrupted_run(tmp_path)
    last = run / "checkpoints" / "last"
    assert (last / "training_state.safetensors").is_file() and (last / "training_state.json").is_file()
    assert not list(last.glob("*.pt")) and not list(last.glob("*.bin"))
    summary = posbias.train(cfg, resume="auto", progress=False)
    assert summary["steps"] == 5 and INTERRUPT["calls"] == 3
    _assert_same_weights(run, reference)


class _Payload:
    """Unpickling this creates a file: the stand-in for any code a pickle can run."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_pickle_payload_in_a_checkpoint_runs_nothing(tmp_path):
    cfg, run = _interrupted_run(tmp_path)
    last = run / "checkpoints" / "last"
    marker = tmp_path / "pwned"
    # An old-format checkpoint (training_state.pt) whose pickle carries a payload.
    for f in ("training_state.safetensors", "training_state.json"):
        (last / f).unlink()
    torch.save({"optimizer": _Payload(marker), "scheduler": {}, "rng": []}, last / "training_state.pt")
    with pytest.raises(ConfigError, match=r"training_state\.pt: refused to load"):
        posbias.train(cfg, resume="auto", progress=False)
    assert not marker.exists()
    # The same through the CLI, on a run of a plain config (the CLI knows no test perturbation).
    plain = build_config(tiny_config(tmp_path / "cli", train={"max_steps": 2, "save_every": 1},
                                     data={"eval_file": None}))
    posbias.train(plain, progress=False)
    last = tmp_path / "cli" / "run" / "checkpoints" / "last"
    for f in ("training_state.safetensors", "training_state.json"):
        (last / f).unlink()
    torch.save({"optimizer": _Payload(marker), "scheduler": {}, "rng": []}, last / "training_state.pt")
    cfg_file = tmp_path / "plain.yaml"
    cfg_file.write_text(json.dumps(plain.to_dict()), encoding="utf-8")
    r = run_cli("train", "qa", "-c", str(cfg_file), "train.max_steps=4", "--resume")
    assert r.returncode == 2 and not marker.exists(), r.stderr
    assert r.stderr.count("\n") == 1 and "refused to load" in r.stderr, r.stderr


def test_an_old_pickle_checkpoint_still_resumes_through_the_safe_path(tmp_path, reference):
    from posbias.train_state import load_state

    cfg, run = _interrupted_run(tmp_path)
    last = run / "checkpoints" / "last"
    state = load_state(last)  # rewritten as the old code wrote it: one torch.save pickle
    assert state["rng"][0]["numpy"][1].dtype.name == "uint32"
    torch.save(state, last / "training_state.pt")
    for f in ("training_state.safetensors", "training_state.json"):
        (last / f).unlink()
    assert posbias.train(cfg, resume="auto", progress=False)["steps"] == 5
    _assert_same_weights(run, reference)


# ---- 9. a crash at any point of a checkpoint save (replace_dir: write last.tmp, last -> last.old,
# last.tmp -> last, remove last.old) still resumes, and ends where the uninterrupted run ends.

def _partial_tmp(last):
    shutil.copytree(last, last.with_name("last.tmp"))
    (last.with_name("last.tmp") / "trainer_state.json").unlink()  # written last: this copy is incomplete


def _complete_tmp(last):
    shutil.copytree(last, last.with_name("last.tmp"))


def _between_renames(last):
    shutil.copytree(last, last.with_name("last.tmp"))
    last.rename(last.with_name("last.old"))


def _before_cleanup(last):
    shutil.copytree(last, last.with_name("last.old"))


def _old_only(last):
    _partial_tmp(last)
    last.rename(last.with_name("last.old"))


@pytest.mark.parametrize("crash", [_partial_tmp, _complete_tmp, _between_renames, _before_cleanup, _old_only])
def test_resume_after_a_crash_at_each_point_of_a_save(tmp_path, reference, crash):
    cfg, run = _interrupted_run(tmp_path)
    crash(run / "checkpoints" / "last")
    summary = posbias.train(cfg, resume="auto", progress=False)
    assert summary["steps"] == 5 and INTERRUPT["calls"] == 3  # resumed at step 2, not restarted
    _assert_same_weights(run, reference)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["last"]


def test_resume_without_a_complete_checkpoint_says_so(tmp_path):
    cfg, run = _interrupted_run(tmp_path)
    (run / "checkpoints" / "last" / "trainer_state.json").unlink()
    (run / "best").mkdir()
    with pytest.raises(ConfigError, match="--resume: .* no complete checkpoint"):
        posbias.train(cfg, resume="auto", progress=False)


# ---- 5 / 10. numeric training keys, a NaN loss, output folders

@pytest.mark.parametrize("override, message", [
    ("train.lr=.nan", "train.lr must be a finite number"),
    ("train.lr=.inf", "train.lr must be a finite number"),
    ("train.epochs=.inf", "train.epochs must be a finite number"),
    ("train.warmup_ratio=.nan", "train.warmup_ratio must be a finite number"),
    ("train.seed=-1", r"train.seed must be in \[0, 2\*\*32\)"),
    ("train.max_grad_norm=-1", "train.max_grad_norm must be >= 0"),
    ("train.weight_decay=-1", "train.weight_decay must be >= 0"),
    ("train.eval_every=0", "train.eval_every must be >= 1"),
    ("train.save_every=-2", "train.save_every must be >= 1"),
    ("train.num_threads=0", r"train.num_threads must be in \[1, 4096\]"),
])
def test_nonsense_training_settings_are_refused(override, message):
    with pytest.raises(ConfigError, match=message):
        build_config(tiny_config(), [override])


@pytest.mark.parametrize("override, message", [
    ("train.lr=!!python/object/apply:os.system [echo hi]", "override 'train.lr=!!python.*not valid YAML"),
    ("train.lr=[1,", r"override 'train.lr=\[1,': the value is not valid YAML"),
    ("train.max_grad_norm=-1", "train.max_grad_norm must be >= 0"),
    ("train.seed=-1", "train.seed must be in"),
])
def test_cli_bad_overrides_are_one_line_exit_2(tmp_path, override, message):
    r = cli_here("train", "qa", "-c", "tiny", f"train.output_dir={tmp_path / 'o'}", override)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert __import__("re").search(message, r.stderr), r.stderr


def test_non_utf8_config_is_named(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes("train:\n  lr: 1e-4  # caf\xe9\n".encode("latin-1"))
    r = cli_here("train", "qa", "-c", str(bad))
    assert r.returncode == 2 and f"{bad}: not UTF-8" in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_a_nan_loss_stops_training_and_names_the_last_checkpoint(tmp_path, monkeypatch):
    import posbias.training as training

    calls = {"n": 0}
    real = training.passes_loss

    def nan_at_step_3(model, passes, targets):
        calls["n"] += 1
        loss = real(model, passes, targets)
        return loss * float("nan") if calls["n"] == 3 else loss

    monkeypatch.setattr(training, "passes_loss", nan_at_step_3)
    cfg = build_config(tiny_config(tmp_path, **SECTIONS))
    with pytest.raises(TrainingError, match=r"loss is nan at step 3; .*checkpoints/last \(step 2\)"):
        posbias.train(cfg, progress=False)
    run = tmp_path / "run"
    info = json.loads((run / "run_info.json").read_text(encoding="utf-8"))
    assert info["status"] == "failed" and "step 3" in info["error"]
    assert not (run / "best").exists()  # no NaN model saved as a result
    state = json.loads((run / "checkpoints/last/trainer_state.json").read_text(encoding="utf-8"))
    assert state["global_step"] == 2


def test_output_dir_that_is_a_file_or_under_one(tmp_path):
    f = tmp_path / "file"
    f.write_text("x", encoding="utf-8")
    for out, message in [(f, "is an existing file"), (f / "sub", "cannot be written")]:
        cfg = build_config(tiny_config(tmp_path, train={"output_dir": str(out)}))
        with pytest.raises(ConfigError, match=f"train.output_dir {out} {message}"):
            posbias.train(cfg, progress=False)
    r = cli_here("train", "qa", "-c", "tiny", f"train.output_dir={f}")
    assert r.returncode == 2 and "is an existing file" in r.stderr, r.stderr


# ---- 8. input that is not CoNLL

def test_conll_reader_refuses_json_prose_and_empty_files(tmp_path):
    squad = tmp_path / "qa.json"
    squad.write_bytes(gzip.decompress(open(DEMO_DEV, "rb").read()))
    pretty = tmp_path / "pretty.json"
    pretty.write_text(json.dumps({"version": "1.1", "data": []}, indent=2), encoding="utf-8")
    jsonl = tmp_path / "mrqa.jsonl"
    jsonl.write_text('{"header": {"dataset": "x"}}\n{"context": "a b", "qas": []}\n', encoding="utf-8")
    prose = tmp_path / "prose.txt"
    prose.write_text("Ana went to Oslo in May and saw the fjords and a great many other things .\n",
                     encoding="utf-8")
    for path in (squad, pretty, jsonl):
        with pytest.raises(DataError, match=f"{path.name}: record 'line 1': this is JSON"):
            read_conll(path)
    with pytest.raises(DataError, match="only line holds 17 columns"):
        read_conll(prose)
    empty = tmp_path / "empty.conll"
    empty.write_text("\n\n-DOCSTART- O\n\n", encoding="utf-8")
    with pytest.raises(DataError, match="empty.conll: no sentences in the file"):
        read_conll(empty)
    # CoNLL lines that merely start with a bracket, and a one-word sentence, are still CoNLL.
    ok = tmp_path / "ok.conll"
    ok.write_text("[ O\nAna B-PER\n] O\n", encoding="utf-8")
    assert read_conll(ok).examples[0].words == ["[", "Ana", "]"]
    one = tmp_path / "one.conll"
    one.write_text("EU NNP B-NP B-ORG\n", encoding="utf-8")
    assert read_conll(one).examples[0].tags == ["B-ORG"]


def test_cli_train_tagging_on_a_json_file(tmp_path):
    squad = tmp_path / "qa.json"
    squad.write_bytes(gzip.decompress(open(DEMO_DEV, "rb").read()))
    r = run_cli("train", "tagging", "-c", "tiny_tagging", f"data.train_file={squad}",
                f"train.output_dir={tmp_path / 'o'}")
    assert r.returncode == 2 and "this is JSON" in r.stderr and r.stderr.count("\n") == 1, r.stderr


# ---- 7. `data build` writes its set through a staged folder too

def test_data_build_killed_midway_leaves_the_previous_build(tmp_path, monkeypatch):
    import posbias.qa.truncate as truncate

    out = tmp_path / "d"
    truncate.build_dataset([DEMO_DEV], out, split=True, seed=4, sample=20)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    calls = {"n": 0}
    original = truncate.atomic_write_json

    def dies_after_first_file(path, obj, indent=2):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt  # killed after writing val.json of the new build
        return original(path, obj, indent)

    monkeypatch.setattr(truncate, "atomic_write_json", dies_after_first_file)
    with pytest.raises(KeyboardInterrupt):
        truncate.build_dataset([DEMO_DEV], out, split=True, seed=5, sample=30)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no mix of two builds
    assert not (tmp_path / "d.tmp").exists()
    (out / "notes.txt").write_text("mine", encoding="utf-8")
    monkeypatch.setattr(truncate, "atomic_write_json", original)
    with pytest.raises(ConfigError, match="holds 'notes.txt', which posbias did not write"):
        truncate.build_dataset([DEMO_DEV], out, split=True, seed=5, sample=30)


def test_yaml_no_stays_a_string():
    """`train.mixed_precision=no` (YAML 1.1 reads no/yes/on/off as booleans); true/false still are."""
    cfg = build_config(tiny_config(), ["train.mixed_precision=no", "train.length_grouping=false"])
    assert cfg.train.mixed_precision == "no" and cfg.train.length_grouping is False
    with pytest.raises(ConfigError, match="train.length_grouping: expected bool, got 'no'"):
        build_config(tiny_config(), ["train.length_grouping=no"])

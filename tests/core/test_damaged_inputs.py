"""Damaged inputs and a hostile environment: every case is one `posbias: error:` line naming the file,
exit code 2, no traceback; a training run that fails after it started says `failed` in run_info.json.

Cases: damaged checkpoints on --resume, damaged model folders, a pickle in an HF folder, lone
surrogates in text, foreign and damaged experiment stores, read-only folders, a full disk. The CLI
runs in-process (`posbias.cli.main`) on one tiny trained run shared by the module.
"""
import builtins
import errno
import json
import os
import pickle
import shutil
import sqlite3
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import posbias
from posbias.cli import main
from posbias.config import build_config
from posbias.errors import known_failure

from helpers import DEMO_DEV, INTERRUPT, tiny_config

ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(run folder, its config file): 2 tiny steps, a checkpoint after each, no eval file."""
    tmp = tmp_path_factory.mktemp("trained")
    cfg = build_config(tiny_config(tmp, train={"max_steps": 2, "save_every": 1},
                                   data={"eval_file": None, "max_train_examples": 16}))
    posbias.train(cfg, progress=False)
    cfg_file = tmp / "config.json"
    cfg_file.write_text(json.dumps(cfg.to_dict()), encoding="utf-8")
    return tmp / "run", cfg_file


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    """(a finished one-run experiment folder, its spec file)."""
    tmp = tmp_path_factory.mktemp("experiment")
    spec = {"name": "t", "base": "tiny", "methods": {"only": {}}, "seeds": [1], "output_dir": str(tmp / "exp"),
            "overrides": {"train": {"max_steps": 1, "eval_every": 1, "log_every": 1},
                          "data": {"max_train_examples": 16, "max_eval_examples": 8, "max_seq_len": 128,
                                   "stride": 48}}}
    spec_file = tmp / "spec.json"
    spec_file.write_text(json.dumps(spec), encoding="utf-8")
    posbias.experiment_run(spec, progress=False)
    return tmp / "exp", spec_file


def cli(capsys, *argv) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(["-q", *map(str, argv)])
    return rc, capsys.readouterr().err


def assert_one_line(rc: int, err: str, *names) -> str:
    assert rc == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("posbias: error: "), err
    for name in names:
        assert str(name) in lines[0], f"{name} not in: {lines[0]}"
    return lines[0]


def run_info(run: Path) -> dict:
    return json.loads((run / "run_info.json").read_text(encoding="utf-8"))


# ---- damaged checkpoints on --resume: each names its file, and the run it was resuming ends `failed`

def _cut(file: Path, keep: int = 1000) -> Path:
    file.write_bytes(file.read_bytes()[:keep])
    return file


def _rewrite_tensors(file: Path, change) -> Path:
    tensors = load_file(str(file))
    change(tensors)
    save_file(tensors, str(file))
    return file


def _json_text(name, text):
    def damage(last: Path) -> Path:
        (last / name).write_text(text, encoding="utf-8")
        return last / name
    return damage


def _bad_dtype(last: Path) -> Path:
    f = last / "training_state.json"
    f.write_text(f.read_text(encoding="utf-8").replace('"uint32"', '"no-such-dtype"'), encoding="utf-8")
    return f


RESUME_DAMAGE = {
    "trainer_state garbage": _json_text("trainer_state.json", "{not json"),
    "trainer_state a list": _json_text("trainer_state.json", "[1, 2]"),
    "trainer_state step a string": _json_text("trainer_state.json", '{"global_step": "2"}'),
    "trainer_state negative seconds": _json_text("trainer_state.json", '{"global_step": 2, "train_seconds": -1}'),
    "training_state without state": _json_text("training_state.json", '{"format": 1}'),
    "training_state state a list": _json_text("training_state.json", '{"format": 1, "state": [1]}'),
    "training_state bad dtype": _bad_dtype,
    "training_state not json": _json_text("training_state.json", "\x00\x01"),
    "training_state optimizer of another shape": _json_text(
        "training_state.json", '{"format": 1, "state": {"__dict__": {"optimizer": {"__dict__": {}}, '
                               '"scheduler": {"__dict__": {}}, "rng": []}}}'),
    "training tensors truncated": lambda last: _cut(last / "training_state.safetensors"),
    "weights truncated": lambda last: _cut(last / "model.safetensors"),
    "weights cut inside the data": lambda last: _cut(last / "model.safetensors",
                                                     (last / "model.safetensors").stat().st_size - 100),
    "weights of another model": lambda last: _rewrite_tensors(last / "model.safetensors",
                                                              lambda t: t.update({"x.weight": torch.zeros(3)})),
    "weights of another shape": lambda last: _rewrite_tensors(
        last / "model.safetensors", lambda t: t.update({k: torch.zeros(7, 3) for k in list(t)[:1]})),
    "weights missing a tensor": lambda last: _rewrite_tensors(last / "model.safetensors",
                                                              lambda t: t.pop(sorted(t)[0])),
}


@pytest.mark.parametrize("damage", RESUME_DAMAGE.values(), ids=RESUME_DAMAGE.keys())
def test_a_damaged_checkpoint_on_resume_is_one_line_and_fails_the_run(tmp_path, capsys, trained, damage):
    src, cfg_file = trained
    run = tmp_path / "run"
    shutil.copytree(src, run)
    damaged = damage(run / "checkpoints" / "last")
    rc, err = cli(capsys, "train", "qa", "-c", cfg_file, f"train.output_dir={run}", "train.max_steps=3", "--resume")
    line = assert_one_line(rc, err, damaged)
    info = run_info(run)
    assert info["status"] == "failed" and info["error"] == line.removeprefix("posbias: error: ")
    assert info["finished"]


def test_a_config_mismatch_on_resume_leaves_the_run_as_it_was(tmp_path, capsys, trained):
    """Not a failure of the run: the user asked for another experiment (the checkpoint is fine)."""
    src, cfg_file = trained
    run = tmp_path / "run"
    shutil.copytree(src, run)
    rc, err = cli(capsys, "train", "qa", "-c", cfg_file, f"train.output_dir={run}", "train.lr=0.5", "--resume")
    assert_one_line(rc, err, "train.lr changed")
    assert run_info(run)["status"] == "finished"


# ---- damaged model folders for evaluate / predict

def _hf_pickle(best: Path, tmp_path: Path) -> tuple[Path, Path]:
    """An HF folder (the export of `best`) whose weights are a pytorch_model.bin pickle carrying a payload."""
    hf = tmp_path / "hf"
    posbias.export(best, hf)
    tensors = load_file(str(hf / "model.safetensors"))
    (hf / "model.safetensors").unlink()
    torch.save({**tensors, "payload": _Payload(tmp_path / "pwned")}, hf / "pytorch_model.bin")
    return hf, hf / "pytorch_model.bin"


class _Payload:
    """Unpickling this creates a file: the stand-in for any code a pickle can run."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _in_best(name, text=None, cut=None):
    def damage(best: Path, tmp_path: Path) -> tuple[Path, Path]:
        if cut is not None:
            _cut(best / name, cut)
        else:
            (best / name).write_text(text, encoding="utf-8")
        return best, best / name
    return damage


MODEL_DAMAGE = {
    "posbias_model.json garbage": _in_best("posbias_model.json", "{x"),
    "posbias_model.json a list": _in_best("posbias_model.json", "[]"),
    "posbias_model.json without head": _in_best("posbias_model.json", "{}"),
    "posbias.yaml garbage": _in_best("posbias.yaml", "[: x"),
    "posbias.yaml a list": _in_best("posbias.yaml", "- 1\n"),
    "config.json garbage": _in_best("config.json", "{x"),
    "weights truncated": _in_best("model.safetensors", cut=1000),
    "weights empty": _in_best("model.safetensors", cut=0),
    "a pickle in pytorch_model.bin": _hf_pickle,
}


@pytest.mark.parametrize("damage", MODEL_DAMAGE.values(), ids=MODEL_DAMAGE.keys())
def test_a_damaged_model_folder_is_one_line(tmp_path, capsys, trained, damage):
    best = tmp_path / "best"
    shutil.copytree(trained[0] / "best", best)
    model, damaged = damage(best, tmp_path)
    rc, err = cli(capsys, "evaluate", "qa", "--model", model, "--data", DEMO_DEV, "data.max_eval_examples=4")
    assert_one_line(rc, err, damaged)
    assert not (tmp_path / "pwned").exists()  # the pickle's payload never ran


# ---- lone surrogates: on the command line and inside a data file

def _squad(tmp_path, question="Where?", context="Paris is nice.", qid="a") -> Path:
    f = tmp_path / "data.json"
    doc = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": context, "qas": [
        {"id": qid, "question": question, "answers": [{"text": "Paris", "answer_start": 0}]}]}]}]}
    f.write_text(json.dumps(doc), encoding="utf-8")  # json.dumps writes a surrogate as "\ud800": valid UTF-8
    return f


def _mrqa(tmp_path, question="Where?", context="Paris is nice.", qid="a") -> Path:
    f = tmp_path / "data.jsonl"
    lines = [{"header": {"dataset": "x"}},
             {"context": context, "qas": [{"qid": qid, "question": question, "answers": ["Paris"],
                                           "detected_answers": [{"char_spans": [[0, 4]]}]}]}]
    f.write_text("\n".join(json.dumps(x) for x in lines) + "\n", encoding="utf-8")
    return f


@pytest.mark.parametrize("make, field, names", [
    (_squad, "question", ["record 'a'", "question is not valid Unicode", r"'\ud800'"]),
    (_squad, "context", ["record 'a'", "context is not valid Unicode"]),
    (_squad, "qid", [r"record 'x\\ud800'", "id is not valid Unicode"]),
    (_mrqa, "question", ["record 'a'", "question is not valid Unicode"]),
    (_mrqa, "context", ["record 'a'", "context is not valid Unicode"]),
])
def test_a_lone_surrogate_in_a_data_file_names_the_record(tmp_path, capsys, trained, make, field, names):
    value = {"question": "Wh\ud800ere?", "context": "Paris is nice.\ud800", "qid": "x\ud800"}[field]
    data = make(tmp_path, **{field: value})
    rc, err = cli(capsys, "evaluate", "qa", "--model", trained[0] / "best", "--data", data)
    assert_one_line(rc, err, data, *names)
    rc, err = cli(capsys, "predict", "qa", "--model", trained[0] / "best", "--data", data)
    assert_one_line(rc, err, data)


@pytest.mark.parametrize("argv", [
    ["predict", "qa", "--question", "Who\ud800?", "--context", "Paris is nice."],
    ["predict", "qa", "--question", "Who?", "--context", "Paris\udcff is nice."],  # a byte that was not UTF-8
    ["explain", "attention", "--question", "Who\ud800?", "--context", "Paris.", "--output-dir", "x"],
    ["predict", "tagging", "--text", "Angela\ud800 Merkel"],
])
def test_a_lone_surrogate_on_the_command_line_is_one_line(tmp_path, capsys, trained, argv):
    rc, err = cli(capsys, *argv[:2], "--model", trained[0] / "best", *argv[2:])
    line = assert_one_line(rc, err, "is not valid")
    assert ("byte 0xff" in line) == ("\udcff" in "".join(argv))


def test_the_api_refuses_a_lone_surrogate_in_a_question(trained):
    with pytest.raises(posbias.errors.ConfigError, match="question is not valid Unicode"):
        posbias.predict(trained[0] / "best", question="Who\ud800?", context="Paris is nice.")


# ---- foreign and damaged experiment stores

def _text_file(db: Path, good: Path) -> None:
    db.write_text("not a database\n" * 100, encoding="utf-8")


def _foreign_tables(db: Path, good: Path) -> None:
    with sqlite3.connect(str(db)) as c:
        c.execute("CREATE TABLE photos (id INTEGER, path TEXT)")


def _foreign_runs_table(db: Path, good: Path) -> None:
    with sqlite3.connect(str(db)) as c:
        c.execute("CREATE TABLE runs (id INTEGER, who TEXT)")


def _malformed(db: Path, good: Path) -> None:
    data = bytearray(good.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    data[page:] = b"\xff" * (len(data) - page)  # every page after the first (the schema) overwritten
    db.write_bytes(bytes(data))


STORES = {"a text file": _text_file, "another program's database": _foreign_tables,
          "a foreign runs table": _foreign_runs_table, "a malformed store": _malformed}


@pytest.mark.parametrize("command", ["report", "copy", "run"])
@pytest.mark.parametrize("store", STORES.values(), ids=STORES.keys())
def test_a_foreign_or_damaged_experiment_store_is_one_line(tmp_path, capsys, experiment, store, command):
    good_dir, spec_file = experiment
    folder = tmp_path / "exp"
    folder.mkdir()
    db = folder / "experiment.sqlite"
    store(db, good_dir / "experiment.sqlite")
    before = db.read_bytes()
    if command == "report":
        rc, err = cli(capsys, "experiment", "report", folder, "--bootstrap-samples", "10")
    elif command == "copy":
        rc, err = cli(capsys, "experiment", "copy", folder, tmp_path / "dest")
    else:
        rc, err = cli(capsys, "experiment", "run", spec_file, "--output-dir", folder)
    assert_one_line(rc, err, db)
    assert db.read_bytes() == before  # never written into
    assert not (folder / "runs").exists()  # nothing trained on a store that cannot record it


def test_a_report_of_a_store_in_a_folder_it_cannot_write_reads_it(tmp_path, capsys, experiment, monkeypatch):
    """An archive on a read-only disk: SQLite cannot make WAL's -shm file there; the store is read
    as immutable and the report goes to --output-dir."""
    folder = tmp_path / "archive"
    shutil.copytree(experiment[0], folder, ignore=shutil.ignore_patterns("runs", "locks"))
    real = sqlite3.connect

    def no_shm(target, *a, **k):  # what SQLite says in a read-only folder
        if str(target) == str(folder / "experiment.sqlite"):
            raise sqlite3.OperationalError("unable to open database file")
        return real(target, *a, **k)

    monkeypatch.setattr(sqlite3, "connect", no_shm)
    monkeypatch.setattr(os, "access", lambda p, mode, **k: False if Path(p) == folder else True)
    rc, err = cli(capsys, "experiment", "report", folder, "--bootstrap-samples", "10", "--output-dir", tmp_path / "r")
    assert rc == 0, err
    assert (tmp_path / "r" / "report.md").is_file()


# ---- read-only folders and a full disk

def _simulate_read_only(monkeypatch, folder: Path) -> None:
    """Writing into `folder` fails with EROFS, as on a read-only mount (for root, whom chmod does not stop):
    Python's own ways of creating, opening for writing, renaming and deleting files."""
    folder = os.path.abspath(folder)

    def inside(p) -> bool:
        p = os.path.abspath(os.fspath(p))
        return p == folder or p.startswith(folder + os.sep)

    def guard(fn, writes=lambda *a, **k: True):
        def wrapped(path, *a, **k):
            if inside(path) and writes(path, *a, **k):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(path))
            return fn(path, *a, **k)
        return wrapped

    for name in ("mkdir", "replace", "rename", "unlink", "rmdir"):
        monkeypatch.setattr(os, name, guard(getattr(os, name)))
    monkeypatch.setattr(os, "open", guard(os.open, lambda p, flags, *a, **k: flags & (os.O_WRONLY | os.O_RDWR)))
    monkeypatch.setattr(builtins, "open", guard(builtins.open, lambda p, mode="r", *a, **k: bool(set(mode) & set("wax+"))))
    real_connect = sqlite3.connect

    def connect(path, *a, **k):  # SQLite cannot create WAL's -shm file in a read-only folder
        if inside(path) and not k.get("uri"):
            raise sqlite3.OperationalError("unable to open database file")
        return real_connect(path, *a, **k)

    monkeypatch.setattr(sqlite3, "connect", connect)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **k: (not inside(p) or mode & os.W_OK == 0) and real_access(p, mode, **k))


def _read_only_case(command, tmp_path, trained, experiment):
    """(argv, the read-only folder) of `command` writing into a folder it cannot write."""
    if command == "experiment run":
        spec = json.loads(experiment[1].read_text(encoding="utf-8"))
        spec["output_dir"] = str(tmp_path / "ro" / "exp")
        (tmp_path / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
        return ["experiment", "run", tmp_path / "spec.json"], tmp_path / "ro"
    if command == "export":
        return ["export", "--model", trained[0] / "best", "--out", tmp_path / "ro" / "hf"], tmp_path / "ro"
    shutil.copytree(experiment[0], tmp_path / "ro", ignore=shutil.ignore_patterns("runs", "locks"),
                    dirs_exist_ok=True)
    return ["experiment", "report", tmp_path / "ro", "--bootstrap-samples", "10"], tmp_path / "ro"


@pytest.mark.parametrize("command", ["experiment run", "export", "experiment report"])
def test_a_read_only_folder_is_one_line(tmp_path, capsys, monkeypatch, trained, experiment, command):
    (tmp_path / "ro").mkdir()
    argv, folder = _read_only_case(command, tmp_path, trained, experiment)
    _simulate_read_only(monkeypatch, folder)
    rc, err = cli(capsys, *argv)
    assert "Read-only file system" in assert_one_line(rc, err, folder)


@pytest.mark.skipif(ROOT, reason="chmod does not stop root")
@pytest.mark.parametrize("command", ["experiment run", "export", "experiment report"])
def test_a_folder_without_write_permission_is_one_line(tmp_path, capsys, trained, experiment, command):
    (tmp_path / "ro").mkdir()
    argv, folder = _read_only_case(command, tmp_path, trained, experiment)
    folder.chmod(0o555)
    try:
        rc, err = cli(capsys, *argv)
    finally:
        folder.chmod(0o755)
    assert "Permission denied" in assert_one_line(rc, err, folder)


def _disk_full_for_weights(monkeypatch):
    """Writing a weights file fails as on a full disk (what `save_safetensors` raises then)."""
    import posbias.checkpoint

    def full(tensors, path, metadata=None):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(posbias.checkpoint, "save_safetensors", full)


def test_a_full_disk_in_train_fails_the_run(tmp_path, capsys, monkeypatch, trained):
    _disk_full_for_weights(monkeypatch)
    run = tmp_path / "run"
    rc, err = cli(capsys, "train", "qa", "-c", trained[1], f"train.output_dir={run}")
    line = assert_one_line(rc, err, run / "checkpoints" / "last.tmp" / "model.safetensors", "No space left on device")
    info = run_info(run)
    assert info["status"] == "failed" and info["error"] == line.removeprefix("posbias: error: ")


def test_a_full_disk_in_evaluate_names_the_file(tmp_path, capsys, monkeypatch, trained):
    import posbias.utils

    real = posbias.utils._json_chunks

    def full(obj, indent):  # a write() on a full disk: an OSError naming no file
        yield from real({}, indent)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(posbias.utils, "_json_chunks", full)
    out = tmp_path / "ev"
    rc, err = cli(capsys, "evaluate", "qa", "--model", trained[0] / "best", "--data", DEMO_DEV,
                  "--output-dir", out, "data.max_eval_examples=4")
    assert_one_line(rc, err, f"{out}.tmp{os.sep}", ".json: No space left on device")
    assert not out.exists()  # nothing half-written left as the result


def test_a_full_disk_in_experiment_run_fails_the_run(tmp_path, capsys, monkeypatch, experiment):
    _disk_full_for_weights(monkeypatch)
    rc, err = cli(capsys, "experiment", "run", experiment[1], "--output-dir", tmp_path / "exp")
    err = "\n".join(x for x in err.splitlines() if not x.startswith("[1/1]"))  # the run's progress label
    assert_one_line(rc, err, tmp_path / "exp" / "runs", "No space left on device")
    assert run_info(tmp_path / "exp" / "runs" / "only" / "seed1")["status"] == "failed"
    with sqlite3.connect(str(tmp_path / "exp" / "experiment.sqlite")) as c:
        assert c.execute("SELECT status FROM runs").fetchall() == [("failed",)]


def test_a_real_safetensors_io_error_becomes_a_named_os_error(tmp_path, monkeypatch):
    import safetensors.torch
    from safetensors import SafetensorError

    from posbias.utils import save_safetensors

    def full(*a, **k):  # what safetensors raises on a full disk: no path, the errno in the text
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    with pytest.raises(OSError) as e:
        save_safetensors({"a": torch.zeros(1)}, tmp_path / "m.safetensors")
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path / "m.safetensors")


# ---- run_info after an interruption; the boundary itself

def test_an_interrupted_run_says_so_in_run_info(tmp_path):
    cfg = build_config(tiny_config(tmp_path, train={"max_steps": 3}, data={"eval_file": None})
                       | {"perturb": [{"name": "_test_interrupt"}]})
    INTERRUPT.update(at=2, calls=0)
    try:
        with pytest.raises(KeyboardInterrupt):
            posbias.train(cfg, progress=False)
    finally:
        INTERRUPT.update(at=None, calls=0)
    info = run_info(tmp_path / "run")
    assert info["status"] == "interrupted" and info["error"] == "interrupted" and info["finished"]


@pytest.mark.parametrize("error, expected", [
    (OSError(errno.EROFS, "Read-only file system", "/x/report.md"), "/x/report.md: Read-only file system"),
    (PermissionError(errno.EACCES, "Permission denied", "/x/a", None, "/x/b"), "/x/a -> /x/b: Permission denied"),
    (json.JSONDecodeError("Expecting value", "x", 0), "not valid JSON"),
    (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), "not valid UTF-8"),
    (RecursionError("maximum recursion depth exceeded"), "nested too deeply"),
    (pickle.UnpicklingError("Weights only load failed"), "refused to load a pickled file"),
    (sqlite3.DatabaseError("database disk image is malformed"), "experiment store"),
    (MemoryError(), "out of memory"),
    (ZeroDivisionError("division by zero"), None),  # a bug: its traceback stays
    (TypeError("unsupported operand"), None),
    (KeyError("x"), None),
])
def test_known_failures_have_one_line_and_bugs_keep_their_traceback(capsys, monkeypatch, error, expected):
    message = known_failure(error)
    assert (message is None) == (expected is None) and (expected is None or expected in message)
    import posbias.api

    def fails(*a, **k):
        raise error

    monkeypatch.setattr(posbias.api, "export", fails)
    if expected is None:
        with pytest.raises(type(error)):
            main(["export", "--model", "m", "--out", "o"])
    else:
        assert_one_line(main(["export", "--model", "m", "--out", "o"]), capsys.readouterr().err, expected)
        monkeypatch.setenv("POSBIAS_DEBUG", "1")  # the escape hatch: the traceback of a known failure
        with pytest.raises(type(error)):
            main(["export", "--model", "m", "--out", "o"])

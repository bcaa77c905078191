"""Output folders (posbias/outputs.py): names that become paths, symlinks, the marker, the writer
lock, restoring a result a kill left in `.tmp`/`.old`, data build's input, experiment copy."""
import gzip
import json
import os
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest
import yaml

import posbias
from posbias import outputs
from posbias.outputs import staged_output
from posbias.config import PRESETS, build_config
from posbias.errors import ConfigError
from posbias.experiment import claim, connect, copy_results, load_experiment, release
from posbias.outputs import MARKER, safe_name
from posbias.qa.truncate import build_dataset
from posbias.training import train
from posbias.utils import replace_dir

from helpers import DEMO_DEV, run_cli, tiny_config

SMOKE = PRESETS / "experiments" / "smoke.yaml"


def tree(root: Path) -> dict:
    """Every path under `root` (links not followed) -> its bytes, link target or "dir"."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = Path(dirpath) / n
            out[str(p.relative_to(root))] = (os.readlink(p) if p.is_symlink() else
                                             "dir" if p.is_dir() else p.read_bytes())
    return out


def smoke_spec(tmp_path, **changes) -> dict:
    spec = yaml.safe_load(SMOKE.read_text(encoding="utf-8"))
    spec.update(changes)
    spec["output_dir"] = str(tmp_path / "exp")
    return spec


# ---------------------------------------------------------------------------------------- names
@pytest.mark.parametrize("name", ["/abs/path", "../x", "..", ".", "", "a/b", "a\\b", "a\x00b", "a\nb", "-rf", "~user",
                                  "x" * 200, 3, None])
def test_a_name_that_is_not_one_path_component_is_refused(name):
    with pytest.raises(ConfigError, match="method name"):
        safe_name(name, "method name")


@pytest.mark.parametrize("name", ["baseline", "random_padding", "rpp.k4", "MaP-2", "seed 1", "α"])
def test_plain_names_pass(name):
    assert safe_name(name, "method name") == name


@pytest.mark.parametrize("where", ["method", "method_abs", "dataset", "eval_set", "train_size"])
def test_an_experiment_name_that_leaves_the_folder_writes_nothing_outside(tmp_path, where):
    outside = tmp_path / "outside"
    (outside / "best").mkdir(parents=True)
    (outside / "best" / "model.safetensors").write_bytes(b"theirs")
    (outside / "train_log.jsonl").write_text("theirs\n")
    before = tree(outside)
    bad = {"method": "../../../outside", "method_abs": str(outside), "dataset": "../../outside"}.get(where)
    changes = {}
    if where.startswith("method"):
        changes["methods"] = {"context_softmax": {}, bad: {}}
    elif where == "dataset":
        changes["datasets"] = {bad: {}}
    elif where == "eval_set":
        changes["eval_sets"] = {"../../../../outside": "demo:dev"}
    else:
        changes["train_sizes"] = ["0/../../../../outside"]
    spec = smoke_spec(tmp_path, **changes)
    with pytest.raises(ConfigError, match="experiment spec: .* (must be one path component|starts with)"):
        posbias.experiment_run(spec, progress=False)
    with pytest.raises(ConfigError):
        load_experiment(spec)
    assert tree(outside) == before
    assert not (tmp_path / "exp").exists()


def test_a_run_folder_reached_through_a_link_is_refused(tmp_path):
    """`runs/<method>` a link to another folder: the run would resolve outside the experiment."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "exp" / "runs").mkdir(parents=True)
    (tmp_path / "exp" / "runs" / "context_softmax").symlink_to(outside)
    with pytest.raises(ConfigError, match="outside the output folder"):
        load_experiment(smoke_spec(tmp_path))
    assert tree(outside) == {}


# -------------------------------------------------------------------------------------- symlinks
@pytest.mark.parametrize("link", [".tmp", ".old", "lock"])
def test_a_link_beside_a_staged_output_writes_nothing_into_its_target(tmp_path, link):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    before = tree(target)
    out = tmp_path / "ev"
    name = ".ev.posbias-lock" if link == "lock" else f"ev{link}"
    (tmp_path / name).symlink_to(target / "lockfile" if link == "lock" else target)
    with pytest.raises(ConfigError, match="symbolic link|lock file"):
        with staged_output(out) as tmp:
            (tmp / "metrics.json").write_text("{}")
    assert tree(target) == before


@pytest.mark.parametrize("name", ["best.tmp", "eval.tmp", "checkpoints/last.tmp", "best", "checkpoints/last.old",
                                  "train_log.jsonl"])
def test_a_link_in_a_training_folder_writes_nothing_into_its_target(tmp_path, name):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    before = tree(target)
    out = tmp_path / "run"
    (out / Path(name).parent).mkdir(parents=True, exist_ok=True)
    outputs.write_marker(out, "train")
    (out / name).symlink_to(target)
    cfg = build_config(tiny_config(tmp_path))
    for overwrite in (False, True):
        with pytest.raises(ConfigError, match="is a symbolic link"):
            train(cfg, overwrite=overwrite, progress=False)
    assert tree(target) == before
    assert (out / name).is_symlink()


@pytest.mark.parametrize("at", ["tmp", "final", "old"])
def test_replace_dir_never_moves_or_deletes_through_a_link(tmp_path, at):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    tmp, final = tmp_path / "x.tmp", tmp_path / "x"
    for p in (tmp, final):
        p.mkdir()
    link = {"tmp": tmp, "final": final, "old": tmp_path / "x.old"}[at]
    if link.exists():
        link.rmdir()
    link.symlink_to(target)
    with pytest.raises(ConfigError, match="symbolic link"):
        replace_dir(tmp, final)
    assert (target / "keep.txt").read_text() == "mine" and link.is_symlink()


# ----------------------------------------------------------------------------- the user's folders
USER_FOLDERS = {
    "eval_outputs": {"config.yaml": "mine: 1\n", "metrics.json": '{"f1": 1}', "eval/predictions.json": "{}"},
    "metrics_only": {"metrics.json": '{"f1": 1}'},
    "run_info_not_ours": {"run_info.json": '{"versions": {"torch": "2"}}', "predictions.json": "{}"},
    "stats": {"stats.json": '{"mine": 1}', "stats.md": "# mine"},
}


def _user_folder(path: Path, files: dict) -> dict:
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    return tree(path)


def _write_evaluation(out):
    with staged_output(out) as tmp:
        (tmp / "metrics.json").write_text("{}")


def _write_training(out):
    train(build_config(tiny_config(None, train={"output_dir": str(out), "max_steps": 1})), overwrite=True,
          progress=False)


def _write_build(out):
    build_dataset([DEMO_DEV], out, truncate=50, sample=2)


def _write_copy(out, src):
    copy_results(src, out)


def _write_report(out, src):
    posbias.experiment_report(src, bootstrap_samples=10, output_dir=out)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """An experiment folder holding a store with one finished run (no training)."""
    exp = tmp_path_factory.mktemp("store") / "exp"
    exp.mkdir()
    outputs.write_marker(exp, "experiment")
    _record(exp, "m/seed1")
    return exp


def _record(exp, name, status="finished"):
    with closing(connect(exp / "experiment.sqlite")) as conn, conn:
        conn.execute("INSERT OR REPLACE INTO runs (name, method, seed, config_hash, status, metrics_json) "
                     "VALUES (?, 'm', 1, 'h', ?, '{}')", (name, status))


def _names(exp):
    with closing(sqlite3.connect(exp / "experiment.sqlite")) as conn:
        return sorted(r[0] for r in conn.execute("SELECT name FROM runs"))


WRITERS = {"evaluate": _write_evaluation, "train": _write_training, "data build": _write_build,
           "experiment copy": _write_copy, "experiment report": _write_report}


@pytest.mark.parametrize("folder", sorted(USER_FOLDERS))
@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_folder_posbias_did_not_write_loses_nothing(tmp_path, store, folder, writer):
    out = tmp_path / "mine"
    out.mkdir()
    before = _user_folder(out, USER_FOLDERS[folder])
    args = (store,) if writer.startswith("experiment") else ()
    with pytest.raises(ConfigError, match="which posbias did not write"):
        WRITERS[writer](out, *args)
    assert tree(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]  # no .tmp, .old or lock left beside


def test_a_folder_an_earlier_posbias_wrote_is_accepted(tmp_path):
    """No marker, but a run_info.json naming a posbias version: an earlier posbias's output."""
    out = tmp_path / "old"
    out.mkdir()
    (out / "run_info.json").write_text(json.dumps({"versions": {"posbias": "0.0.9"}}))
    (out / "metrics.json").write_text("{}")
    _write_evaluation(out)
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "metrics.json"]
    assert json.loads((out / MARKER).read_text())["written_by"] == "posbias"


# ----------------------------------------------------------------------------------- data build
@pytest.mark.parametrize("how", ["same_path", "symlink", "hard_link", "inside_tmp"])
def test_data_build_refuses_to_write_over_its_input(tmp_path, how):
    d = tmp_path / "D"
    d.mkdir()
    data = d / "train.json"
    with open(DEMO_DEV, "rb") as f:
        data.write_bytes(gzip.decompress(f.read()))
    given = data
    if how == "symlink":
        given = tmp_path / "link.json"
        given.symlink_to(data)
    elif how == "hard_link":
        given = tmp_path / "hard.json"
        os.link(data, given)
    elif how == "inside_tmp":
        (tmp_path / "D.tmp").mkdir()
        given = tmp_path / "D.tmp" / "in.json"
        given.write_bytes(data.read_bytes())
    outputs.write_marker(d, "data build")  # even a folder posbias wrote
    before = tree(tmp_path)
    with pytest.raises(ConfigError, match="holds the input"):
        build_dataset([str(given)], d, truncate=50, name="train")
    assert tree(tmp_path) == before


# ----------------------------------------------------------------------------------------- lock
HOLDER = """
import sys, time
from posbias import outputs
fd = outputs.take_lock(sys.argv[1], "test")
print("held", flush=True)
time.sleep(60)
"""


@pytest.fixture
def held(tmp_path):
    """A folder whose writer lock another process holds."""
    out = tmp_path / "ev"
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(Path(posbias.__file__).parents[1])})
    try:
        assert p.stdout.readline().strip() == "held"
        yield out, p.pid
    finally:
        p.kill()
        p.wait(timeout=30)


@pytest.mark.parametrize("writer", ["evaluate", "train", "data build", "experiment report"])
def test_a_second_writer_is_refused_while_the_first_holds_the_folder(held, store, writer):
    out, pid = held
    args = (store,) if writer.startswith("experiment") else ()
    with pytest.raises(ConfigError, match=rf"{out.name} is being written by pid {pid} "):
        WRITERS[writer](out, *args)
    assert not out.exists() or not any(out.iterdir())  # train checks that it can create the folder first


def test_two_evaluations_never_mix(tmp_path):
    """The second evaluation into a folder, started while the first writes, is refused: the folder
    ends with the first one's predictions beside the first one's metrics."""
    out = tmp_path / "ev"
    with staged_output(out) as first:
        (first / "predictions.json").write_text('"first"')
        with pytest.raises(ConfigError, match="is being written by pid"):
            with staged_output(out) as second:
                (second / "predictions.json").write_text('"second"')
        (first / "metrics.json").write_text('"first"')
    assert {p.name: p.read_text() for p in out.iterdir() if p.name != MARKER} == {
        "predictions.json": '"first"', "metrics.json": '"first"'}
    with staged_output(out) as again:  # the lock went with its holder
        (again / "metrics.json").write_text('"again"')
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ev"]


# ------------------------------------------------------------------------------ restore after a kill
@pytest.mark.parametrize("left", ["old", "tmp", "tmp_and_old", "unfinished_tmp_and_old"])
def test_a_result_a_kill_left_in_tmp_or_old_is_restored(tmp_path, left):
    out = tmp_path / "ev"
    expected = None
    if "old" in left:
        (tmp_path / "ev.old").mkdir()
        outputs.write_marker(tmp_path / "ev.old", "evaluate")
        (tmp_path / "ev.old" / "metrics.json").write_text('"old"')
        expected = '"old"'
    if "tmp" in left:
        (tmp_path / "ev.tmp").mkdir()
        (tmp_path / "ev.tmp" / "metrics.json").write_text('"new"')
        if not left.startswith("unfinished"):
            outputs.write_marker(tmp_path / "ev.tmp", "evaluate")  # the marker is written last: complete
            expected = '"new"'
    with pytest.raises(KeyboardInterrupt):  # the next run: killed as well, after the restore
        with staged_output(out):
            raise KeyboardInterrupt
    assert (out / "metrics.json").read_text() == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ev"]


# ---------------------------------------------------------------------------------- experiment copy
def test_experiment_copy_into_a_running_grid_loses_no_record(tmp_path):
    src, dest = tmp_path / "src", tmp_path / "dest"
    for exp in (src, dest):
        exp.mkdir()
        outputs.write_marker(exp, "experiment")
    for name in ("a/seed1", "a/seed2", "b/seed1"):
        _record(src, name)
    (src / "experiment.yaml").write_text("name: src\n")
    (dest / "experiment.yaml").write_text("name: running\n")
    runner = connect(dest / "experiment.sqlite")  # the running grid's store connection
    lock = claim(dest, "c/seed1")  # ... and the run it trains
    try:
        with runner:
            runner.execute("INSERT INTO runs (name, status) VALUES ('c/seed0', 'finished')")
        res = copy_results(src, dest)
        with runner:  # the grid records its run after the copy
            runner.execute("INSERT INTO runs (name, status) VALUES ('c/seed1', 'finished')")
    finally:
        runner.close()
        release(lock)
    assert _names(dest) == ["a/seed1", "a/seed2", "b/seed1", "c/seed0", "c/seed1"]
    assert res["spec"] == "kept" and (dest / "experiment.yaml").read_text() == "name: running\n"
    assert copy_results(src, dest)["spec"] == "replaced"  # no grid running any more


def test_cli_data_build_over_its_input_is_one_line(tmp_path):
    d = tmp_path / "D"
    d.mkdir()
    with open(DEMO_DEV, "rb") as f:
        (d / "train.json").write_bytes(gzip.decompress(f.read()))
    before = tree(d)
    r = run_cli("data", "build", "--input", str(d / "train.json"), "--out", str(d), "--name", "train",
                "--truncate", "50")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith(f"posbias: error: --out {d} holds the input {d / 'train.json'}")
    assert tree(d) == before

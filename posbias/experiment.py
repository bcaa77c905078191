"""Experiments: a grid of runs (dataset x train size x method x seed), a resumable SQLite store.

An experiment spec (YAML) names a base run config and a grid:

    name: smoke
    base: tiny                     # preset name, YAML path (relative to the spec) or a mapping
    overrides: {train: {max_steps: 4}}          # applied to every run
    methods:                       # name -> overrides; the first is the baseline unless `baseline:`
      baseline: {}
      random_padding: {perturb: [{name: random_padding}]}
    seeds: [1, 2, 3]
    datasets: {squad: {}}          # optional: name -> overrides
    train_sizes: [1000, 2000]      # optional: data.max_train_examples
    eval_sets: {test: path.json}   # optional: scored with each run's best checkpoint after training
    position_eval:                 # optional, tagging: the duplicated-test-set evaluation F1(alpha)
      test: {k_max: 10, quantiles: [0.25, 0.75], alphas: [5, 10]}    # of an eval set (see below)
    output_dir: runs/experiments/smoke

Every run is an ordinary `posbias.train` (+ `posbias.evaluate` on each eval set) in its own folder;
for a given seed every method sees the same batches (the order depends on the seed and the data
only). Results go to `<output_dir>/experiment.sqlite`, one transaction per finished run.

Sharing a store. Any number of `experiment run` processes on one folder of one machine split the grid
between them (filling idle cores or GPUs):
- a process trains a run only while it holds the run's lock, `<output_dir>/locks/<run>.lock`, an OS
  lock (flock; a locked byte on Windows) taken without waiting; a run another process holds is left
  to it, and once its own pass is done a process waits for those (unless `wait=False`, `--no-wait`);
- the kernel drops a lock when its process ends, however it ends, so the run of a crashed (killed,
  out-of-memory) process is free again: the next process to find it resumes it from its last
  checkpoint. A process that hangs keeps its lock: end it (its pid is in the lock file);
- after taking a lock a process reads the run's record again (another may have finished it), and
  records through WAL + BEGIN IMMEDIATE transactions, so writers queue instead of failing.
Across machines, give each a disjoint `--only` and join their stores with `experiment copy` (OS
locks on network file systems are not to be trusted). A store SQLite cannot read gives a ConfigError
naming it: move it aside and run again; finished runs are re-collected from their folders (their last
checkpoint is complete, so nothing trains again).
"""
from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path

import numpy as np
import yaml

from .config import RunConfig, build_config, deep_merge, load_yaml, parse_overrides
from . import outputs
from .errors import ConfigError, RunError, did_you_mean
from .registry import SEGMENTERS

try:
    import fcntl
except ImportError:  # Windows: a locked byte instead of flock; both end with their process
    fcntl = None
    import msvcrt

# Per-question segmenters: name -> function(examples, eval_dir, checkpoint, **options) -> {qid: label},
# where eval_dir holds the run's predictions/nbest for those examples and checkpoint its model.
# Position analyses (answer-position quartiles, S_X^(1)/S_X^(2)) register here (qa/positions.py), and
# so does the gold answer length (qa/answer_length.py). A segmenter may carry `gold_only` (see
# gold_segment_labels), `needs_checkpoint = False` (its labels come from the examples' text alone, so
# an archived store without checkpoints can still recompute them) and `check_options(options, key)`,
# called when the spec is loaded.

SPEC_KEYS = {"name", "base", "overrides", "methods", "seeds", "datasets", "train_sizes", "eval_sets",
             "output_dir", "baseline", "segments", "description", "position_eval", "exclude"}
POSITION_EVAL_OPTIONS = {"k_max", "quantiles", "modes", "max_len", "batch_tokens", "alphas"}


@dataclass
class Run:
    """One cell of the grid."""

    name: str
    method: str
    seed: int
    dataset: str | None
    train_size: int | None
    config: RunConfig
    output_dir: Path

    @property
    def config_hash(self) -> str:
        return self.config.hash()


@dataclass
class Experiment:
    name: str
    output_dir: Path
    runs: list[Run]
    baseline: str
    methods: list[str]
    eval_sets: dict[str, str] = field(default_factory=dict)
    segments: list[tuple[str, str, dict]] = field(default_factory=list)
    """(label, segmenter name, options) for each entry of the spec's `segments`."""
    spec_path: str | None = None
    position_eval: dict[str, dict] = field(default_factory=dict)
    """Eval set name -> options of the task's position evaluation (tagging: F1(alpha) on D*_test(k))."""

    @property
    def db_path(self) -> Path:
        return self.output_dir / "experiment.sqlite"


def _as_overrides(value, key: str) -> dict:
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return parse_overrides(value)
    raise ConfigError(f"{key}: expected a mapping or a list of key=value strings, got {value!r}")


def _segment_spec(entry, i: int) -> tuple[str, str, dict]:
    """`name` or `{name: ..., option: value}` -> (label such as "first_x_tokens(x=100)", name, options)."""
    from .tasks import all_tasks

    all_tasks()  # importing the task packages registers their segmenters

    if isinstance(entry, str):
        entry = {"name": entry}
    if not isinstance(entry, dict) or "name" not in entry:
        raise ConfigError(f"segments[{i}] must be a name or a mapping with a name, got {entry!r}")
    segmenter = SEGMENTERS.get(entry["name"], f"segments[{i}].name")
    options = {k: v for k, v in entry.items() if k != "name"}
    if hasattr(segmenter, "check_options"):  # refuse bad options now, not after training
        segmenter.check_options(options, f"segments[{i}]")
    label = entry["name"] + (f"({', '.join(f'{k}={v}' for k, v in sorted(options.items()))})" if options else "")
    return label, entry["name"], options


def load_experiment(spec, output_dir: str | None = None) -> Experiment:
    """Expand a spec (path or mapping) into its runs, each with a validated config."""
    from .config import preset_path

    base_dir = Path.cwd()
    spec_path = None
    if not isinstance(spec, dict):
        spec_path = str(spec)
        base_dir = Path(spec).resolve().parent
        spec = load_yaml(spec)
    unknown = sorted(set(spec) - SPEC_KEYS)
    if unknown:
        raise ConfigError(f"experiment spec: unknown key {unknown[0]!r}"
                          + (did_you_mean(unknown[0], SPEC_KEYS, quote=True) or f"; known keys: {sorted(SPEC_KEYS)}"))
    for key in ("name", "methods", "seeds"):
        if key not in spec:
            raise ConfigError(f"experiment spec: {key} is required")
    methods = spec["methods"]
    if not isinstance(methods, dict) or not methods:
        raise ConfigError("experiment spec: methods must be a non-empty mapping name -> overrides")
    seeds = spec["seeds"]
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds):
        raise ConfigError(f"experiment spec: seeds must be a non-empty list of integers, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"experiment spec: seeds repeat: {seeds}")
    baseline = spec.get("baseline", next(iter(methods)))
    if baseline not in methods:
        raise ConfigError(f"experiment spec: baseline {baseline!r} is not one of the methods {list(methods)}")

    base = spec.get("base", {})
    if isinstance(base, str):
        candidate = base_dir / base
        base = load_yaml(candidate if candidate.is_file() else preset_path(base))
    elif not isinstance(base, dict):
        raise ConfigError(f"experiment spec: base must be a preset, a path or a mapping, got {base!r}")
    base = deep_merge(base, _as_overrides(spec.get("overrides"), "overrides"))
    out = Path(output_dir or spec.get("output_dir") or f"runs/experiments/{spec['name']}")

    exclude = spec.get("exclude") or []
    if not isinstance(exclude, list) or not all(isinstance(p, str) for p in exclude):
        raise ConfigError(f"experiment spec: exclude must be a list of run-name patterns, got {exclude!r}")
    datasets = spec.get("datasets") or {None: {}}
    sizes = spec.get("train_sizes") or [None]
    if not isinstance(datasets, dict):
        raise ConfigError("experiment spec: datasets must be a mapping name -> overrides")
    if not isinstance(sizes, list):
        raise ConfigError(f"experiment spec: train_sizes must be a list of integers, got {sizes!r}")
    # Method, dataset and size name the run's folder (runs/<dataset>/n<size>/<method>/seed<k>): each
    # must be one plain path component, or a run would train (and delete) outside the experiment.
    for m in methods:
        outputs.safe_name(m, "experiment spec: method name")
    for ds_name in datasets:
        if ds_name is not None:
            outputs.safe_name(ds_name, "experiment spec: dataset name")
    for size in sizes:
        if size:
            outputs.safe_name(f"n{size}", "experiment spec: train_sizes entry")
    runs = []
    for ds_name, ds_over in datasets.items():
        for size in sizes:
            for method, m_over in methods.items():
                for seed in seeds:
                    name = _run_name(ds_name, size, method, seed)
                    if any(fnmatchcase(name, p) for p in exclude):
                        continue
                    d = deep_merge(base, _as_overrides(ds_over, f"datasets.{ds_name}"))
                    d = deep_merge(d, _as_overrides(m_over, f"methods.{method}"))
                    run_dir = out / "runs" / name
                    outputs.inside(out, run_dir, f"experiment run {name}")
                    extra = {"train": {"seed": seed, "output_dir": str(run_dir)}}
                    if size:
                        extra["data"] = {"max_train_examples": size}
                    try:
                        cfg = build_config(deep_merge(d, extra))
                    except ConfigError as e:
                        raise ConfigError(f"experiment run {name}: {e}") from None
                    runs.append(Run(name, method, seed, ds_name, size, cfg, run_dir))
    grid = [_run_name(d, n, m, k) for d in datasets for n in sizes for m in methods for k in seeds]
    unused = [p for p in exclude if not any(fnmatchcase(name, p) for name in grid)]
    if unused:
        raise ConfigError(f"experiment spec: exclude pattern {unused[0]!r} matches none of the grid's runs")
    if not runs:
        raise ConfigError("experiment spec: exclude removes every run of the grid")
    eval_sets = spec.get("eval_sets") or {}
    if not isinstance(eval_sets, dict):
        raise ConfigError("experiment spec: eval_sets must be a mapping name -> file")
    for name in eval_sets:  # names the folder runs/<run>/evals/<name>
        outputs.safe_name(name, "experiment spec: eval_sets name")
    segments = [_segment_spec(s, i) for i, s in enumerate(spec.get("segments") or [])]
    position_eval = _position_eval_spec(spec.get("position_eval"), eval_sets, runs)
    return Experiment(spec["name"], out, runs, baseline, list(methods), dict(eval_sets), list(segments),
                      spec_path, position_eval)


def _run_name(dataset, size, method: str, seed: int) -> str:
    """`<dataset>/n<size>/<method>/seed<k>`, without the parts the grid does not have."""
    return "/".join(p for p in (dataset, f"n{size}" if size else None, method, f"seed{seed}") if p)


def _position_eval_spec(value, eval_sets: dict, runs: list[Run]) -> dict[str, dict]:
    """`position_eval: {eval set: {options}}`, validated: known eval sets and options, a task that has it."""
    from .tasks import get_task

    if not value:
        return {}
    if not isinstance(value, dict):
        raise ConfigError("experiment spec: position_eval must be a mapping eval set -> options")
    for name, options in value.items():
        if name not in eval_sets:
            raise ConfigError(f"experiment spec: position_eval.{name} is not one of the eval_sets {sorted(eval_sets)}"
                              + did_you_mean(name, eval_sets, prefix="position_eval."))
        if not isinstance(options or {}, dict):
            raise ConfigError(f"experiment spec: position_eval.{name} must be a mapping of options")
        unknown = set(options or {}) - POSITION_EVAL_OPTIONS
        if unknown:
            bad = sorted(unknown)[0]
            raise ConfigError(f"experiment spec: position_eval.{name}.{bad} is not an option"
                              + (did_you_mean(bad, POSITION_EVAL_OPTIONS, prefix=f"position_eval.{name}.")
                                 or f" ({', '.join(sorted(POSITION_EVAL_OPTIONS))})"))
    for task in {r.config.task for r in runs}:
        if not hasattr(get_task(task), "position_eval_checkpoint"):
            raise ConfigError(f"experiment spec: position_eval is not available for task {task!r}")
    return {name: dict(options or {}) for name, options in value.items()}


# ------------------------------------------------------------------------------------------- store
SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    name TEXT PRIMARY KEY, method TEXT, seed INTEGER, dataset TEXT, train_size INTEGER,
    config_hash TEXT, config_json TEXT, output_dir TEXT, status TEXT,
    started TEXT, finished TEXT, wall_seconds REAL, train_seconds REAL,
    metrics_json TEXT, versions_json TEXT
);
CREATE TABLE IF NOT EXISTS segments (
    run TEXT, eval_set TEXT, segmenter TEXT, segment TEXT, n INTEGER, exact REAL, f1 REAL,
    PRIMARY KEY (run, eval_set, segmenter, segment)
);
-- Per-example scores. QA: one row per question, its (EM, F1). Tagging: one row per sentence, the
-- (numerator, denominator) of the main metric in (exact, f1), so that sums give the corpus value.
CREATE TABLE IF NOT EXISTS question_scores (
    run TEXT, eval_set TEXT, qid TEXT, exact REAL, f1 REAL, PRIMARY KEY (run, eval_set, qid)
);
-- Per-run series: `loss` and `val_<metric>` by training step; `position_updates` by position id (step
-- column): the fraction of optimizer steps in which that position embedding got a gradient.
CREATE TABLE IF NOT EXISTS curves (
    run TEXT, kind TEXT, step INTEGER, value REAL, PRIMARY KEY (run, kind, step)
);
"""


STORE_WAY_OUT = ("move it aside (with its -wal and -shm files) and run `posbias experiment run` again: finished "
                 "runs are re-collected from their folders without training; or restore an archive with "
                 "`posbias experiment copy`")


@contextmanager
def readable_store(db_path):
    """A store SQLite cannot read ('file is not a database', 'database disk image is malformed')
    becomes a ConfigError naming the file and the way out; one it cannot open or write now (a
    read-only folder, a full disk, locked for a minute) a ConfigError naming the file."""
    try:
        yield
    except sqlite3.DatabaseError as e:
        if isinstance(e, sqlite3.OperationalError):  # cannot open, locked, disk full: the file may be fine
            raise ConfigError(f"{db_path}: {' '.join(str(e).split())} (SQLite)") from None
        if type(e) is not sqlite3.DatabaseError:  # a constraint, ...: not a damaged file
            raise
        raise ConfigError(f"{db_path} is not a readable experiment store ({e}); {STORE_WAY_OUT}") from None


def check_store(conn, db_path, *, new_ok: bool = False) -> None:
    """Refuse a SQLite file that is not a posbias store (another program's database, or one whose
    tables lack posbias's columns) before anything reads or writes it; `new_ok`: an empty database
    (a store being created) is fine."""
    with closing(sqlite3.connect(":memory:")) as ours:
        ours.executescript(SCHEMA)
        want = {t: {c[1] for c in ours.execute(f"PRAGMA table_info({t})")}
                for (t,) in ours.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    have = {t for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not have and new_ok:
        return
    for table in ("runs", *sorted(set(want) - {"runs"})):
        if table not in have:
            if table != "runs" and new_ok:  # an older store: `connect` adds the tables it lacks
                continue
            why = f"it has no {table} table" + (f" (its tables: {', '.join(sorted(have)[:5])})" if have else "")
        elif missing := sorted(want[table] - {c[1] for c in conn.execute(f"PRAGMA table_info({table})")}):
            why = f"its {table} table has no {missing[0]} column"
        else:
            continue
        raise ConfigError(f"{db_path} is not a posbias experiment store: {why}; {STORE_WAY_OUT}")


def open_for_reading(db_path) -> sqlite3.Connection:
    """The store, for reading (a report, the source of a copy). In a folder this process cannot
    write (an archive on a read-only disk, a colleague's folder) SQLite cannot create the -shm file
    that WAL mode needs; a store there with no -wal file (its writers closed) holds everything in
    the main file and is read as immutable."""
    conn = None
    try:
        conn = sqlite3.connect(str(db_path), timeout=60)
        conn.execute("SELECT 1 FROM sqlite_master LIMIT 1")
        return conn
    except BaseException as e:
        if conn is not None:
            conn.close()
        if (not isinstance(e, sqlite3.OperationalError) or os.access(Path(db_path).parent, os.W_OK)
                or Path(f"{db_path}-wal").exists()):
            raise
    return sqlite3.connect(f"{Path(db_path).resolve().as_uri()}?immutable=1", uri=True)


def connect(db_path) -> sqlite3.Connection:
    """The store, shared by every process of the folder: WAL (readers such as a report never block a
    writing run), a 60 s busy timeout, and BEGIN IMMEDIATE for each `with conn:` write transaction, so
    that writers queue for the lock at the start instead of failing halfway."""
    Path(db_path).parent.mkdir(parents=True, exist_ok=True)
    with readable_store(db_path):
        conn = sqlite3.connect(str(db_path), timeout=60, isolation_level="IMMEDIATE")
    try:
        with readable_store(db_path):
            check_store(conn, db_path, new_ok=True)  # before WAL: another program's file stays untouched
            for attempt in range(100):
                # Switching to WAL needs the file alone for a moment; a process opening the store
                # while another switches it may get 'database is locked' without waiting: retry.
                try:
                    conn.execute("PRAGMA journal_mode=WAL")
                    break
                except sqlite3.OperationalError as e:
                    if "locked" not in str(e) or attempt == 99:
                        raise
                    time.sleep(0.1)
            conn.executescript(SCHEMA)
    except BaseException:
        conn.close()
        raise
    return conn


def lock_path(exp_dir, run_name: str) -> Path:
    return Path(exp_dir) / "locks" / f"{run_name}.lock"


def claim(exp_dir, run_name: str) -> int | None:
    """Take a run's lock without waiting: its file descriptor (pass it to `release`), or None when
    another live process holds it. The lock is the OS's, so it ends with the holder's process however
    that ends; the holder's pid, host and start time go into the file, for messages only."""
    from .utils import now_iso

    path = lock_path(exp_dir, run_name)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not outputs.is_marked(exp_dir):  # a process sharing the folder may claim before this one marks it
        outputs.write_marker(exp_dir, "experiment run")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        taken = _try_lock(fd)
    except BaseException:
        os.close(fd)
        raise
    if not taken:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": now_iso()}).encode())
    return fd


def _try_lock(fd: int) -> bool:
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # held; any other OSError (a file system without locks) is raised
            return False
        return True
    os.lseek(fd, 0, os.SEEK_SET)
    try:
        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
    except OSError:
        return False
    return True


def release(fd: int) -> None:
    os.ftruncate(fd, 0)  # no holder; closing (here, or the kernel at exit) ends the lock
    os.close(fd)


def holder(exp_dir, run_name: str) -> str:
    """Who holds a run's lock, as its lock file says: "pid 123 on host (since ...)"."""
    try:
        info = json.loads(lock_path(exp_dir, run_name).read_text(encoding="utf-8"))
        return f"pid {info['pid']} on {info['host']} (since {info['since']})"
    except (OSError, ValueError, KeyError, TypeError):  # being written, or unreadable while locked (Windows)
        return "another process"


def run_status(conn, name: str) -> tuple[str | None, str | None]:
    row = conn.execute("SELECT status, config_hash FROM runs WHERE name = ?", (name,)).fetchone()
    return (row[0], row[1]) if row else (None, None)


# --------------------------------------------------------------------------------------- execution
def plan(exp: Experiment, launcher: str = "local", accelerate_args: str = "") -> list[dict]:
    """The expanded run list, with the command that trains each run on its own."""
    rows = []
    for run in exp.runs:
        cfg_file = run.output_dir / "run_config.yaml"
        if launcher == "accelerate":
            cmd = (f"accelerate launch {accelerate_args} -m posbias train {run.config.task} -c {cfg_file} "
                   "--resume").replace("  ", " ")
        else:
            cmd = f"posbias train {run.config.task} -c {cfg_file} --resume"
        rows.append({"name": run.name, "method": run.method, "seed": run.seed, "dataset": run.dataset,
                     "train_size": run.train_size, "config_hash": run.config_hash,
                     "output_dir": str(run.output_dir), "command": cmd})
    return rows


def run_experiment(spec, output_dir: str | None = None, *, launcher: str = "local",
                   accelerate_args: str = "", dry_run: bool = False, force: bool = False,
                   progress: bool = True, only: list[str] | None = None, wait: bool = True,
                   device: str | None = None) -> dict:
    """Run every unfinished run of the grid; finished runs are skipped, interrupted ones resumed.

    A run whose config changed since it was recorded is refused (all are checked before anything
    runs) unless `force`, which redoes it from scratch. `only`: shell patterns of run names (e.g.
    `cp/*`, `rpp/seed2`); the other runs are left alone. Several processes may run one grid at once
    (see "Sharing a store" above): a run another process holds is left to it, and then waited for
    unless `wait` is False (it is taken over if its holder dies before finishing it).

    Returns the runs this process trained (`ran`), found finished (`skipped_finished`), saw finished
    by other processes (`finished_by_others`) and, without `wait`, left to them (`left_to_others`).
    """
    if launcher not in ("local", "accelerate"):
        raise ConfigError(f"--launcher must be local or accelerate, got {launcher!r}")
    exp = load_experiment(spec, output_dir)
    if device is not None:  # where runs train and are evaluated; not part of a run's config hash
        from .devices import check_device_spec

        check_device_spec(device, "--device")
        for run in exp.runs:
            run.config.train.device = device
    if only:
        picked = [r for r in exp.runs if any(fnmatchcase(r.name, p) for p in only)]
        if not picked:
            raise ConfigError(f"--only {' '.join(only)} matches none of the runs of {exp.name} "
                              f"({', '.join(r.name for r in exp.runs[:6])}{', ...' if len(exp.runs) > 6 else ''})")
        exp.runs = picked
    if dry_run:
        # Each run's config is written so that the printed commands work as they are, e.g. on the
        # nodes of a cluster; a later `experiment run` then only collects the finished runs.
        from .config import save_config

        outputs.claim_folder(exp.output_dir, "experiment output_dir")
        for run in exp.runs:
            _run_folder(run)
            save_config(run.config, run.output_dir / "run_config.yaml")
        return {"experiment": exp.name, "output_dir": str(exp.output_dir), "runs": plan(exp, launcher, accelerate_args)}
    outputs.claim_folder(exp.output_dir, "experiment output_dir")  # new, empty or posbias's own
    _save_spec(exp, spec)
    outcome: dict[str, list[str]] = {"ran": [], "skipped_finished": [], "finished_by_others": []}
    options = {"force": force, "launcher": launcher, "accelerate_args": accelerate_args, "progress": progress}
    with closing(connect(exp.db_path)) as conn, readable_store(exp.db_path):
        changed = []
        for run in exp.runs:
            _, old_hash = run_status(conn, run.name)
            if old_hash is not None and old_hash != run.config_hash:
                changed.append(run.name)
        if changed and not force:
            raise _changed_error(exp, changed)
        held = []  # runs another live process is training
        for i, run in enumerate(exp.runs):
            status, old_hash = run_status(conn, run.name)
            if status == "finished" and old_hash == run.config_hash:
                outcome["skipped_finished"].append(run.name)
                continue
            lock = claim(exp.output_dir, run.name)
            if lock is None:
                print(f"[{i + 1}/{len(exp.runs)}] {run.name}: held by {holder(exp.output_dir, run.name)}, left to it",
                      file=sys.stderr, flush=True)
                held.append(run)
                continue
            key = _run_claimed(exp, run, conn, lock, f"[{i + 1}/{len(exp.runs)}] {run.name}", **options)
            outcome[key].append(run.name)  # "ran", or "finished_by_others" since the first look
        if held and wait:
            print(f"waiting for {len(held)} run(s) held by other processes: {', '.join(r.name for r in held)}",
                  file=sys.stderr, flush=True)
        while held and wait:
            for run in list(held):
                lock = claim(exp.output_dir, run.name)
                if lock is None:
                    continue
                held.remove(run)  # finished by its holder, or free again because its holder died
                key = _run_claimed(exp, run, conn, lock, f"[taken over] {run.name}", **options)
                outcome[key].append(run.name)
            if held:
                time.sleep(0.5)
    return {"experiment": exp.name, "output_dir": str(exp.output_dir), **outcome,
            "left_to_others": [r.name for r in held]}


def _changed_error(exp: Experiment, changed: list[str]) -> ConfigError:
    return ConfigError(
        f"experiment {exp.name}: the config of run {changed[0]} changed since it was recorded "
        f"({len(changed)} run(s) in all); use a new output_dir, revert the spec, or pass --force "
        "to redo them")


def _run_claimed(exp: Experiment, run: Run, conn, lock: int, label: str, *, force: bool, **options) -> str:
    """With the run's lock held: read its record again (another process may have finished it since
    the first look: "finished_by_others"), else train and record it ("ran"); then let the lock go."""
    try:
        status, old_hash = run_status(conn, run.name)
        if status == "finished" and old_hash == run.config_hash:
            return "finished_by_others"
        if old_hash is not None and old_hash != run.config_hash and not force:
            raise _changed_error(exp, [run.name])  # recorded with another config by another process meanwhile
        print(label, file=sys.stderr, flush=True)
        try:
            execute_run(exp, run, conn, fresh=old_hash not in (None, run.config_hash), lock=lock, **options)
        except BaseException as e:
            _record_failure(conn, run.name, e)
            raise
        return "ran"
    finally:
        release(lock)


def _record_failure(conn, name: str, e: BaseException) -> None:
    """Best effort, with the run's lock still held: its store record says `failed` (`interrupted`),
    not `running` (its run_info.json says why). A store that cannot be written (a full disk) is
    left as it is: the original error is the one to report."""
    from .utils import now_iso

    try:
        with conn:
            conn.execute("UPDATE runs SET status = ?, finished = ? WHERE name = ? AND status = 'running'",
                         ("interrupted" if isinstance(e, KeyboardInterrupt) else "failed", now_iso(), name))
    except (sqlite3.Error, OSError):
        pass


def _run_folder(run: Run) -> Path:
    """`runs/<name>` of an experiment folder already claimed (`outputs.claim_folder`): created and
    marked as posbias's, so that training accepts it beside the run_config.yaml written first."""
    run.output_dir.mkdir(parents=True, exist_ok=True)
    if not outputs.is_marked(run.output_dir):
        outputs.write_marker(run.output_dir, f"experiment run {run.name}")
    return run.output_dir


def _save_spec(exp: Experiment, spec) -> None:
    from .utils import atomic_write_text

    d = load_yaml(spec) if not isinstance(spec, dict) else dict(spec)
    d["baseline"] = exp.baseline  # explicit, so the report never depends on key order
    atomic_write_text(exp.output_dir / "experiment.yaml", yaml.safe_dump(d, sort_keys=False))


def execute_run(exp: Experiment, run: Run, conn, *, fresh: bool = False, launcher: str = "local",
                accelerate_args: str = "", progress: bool = True, lock: int | None = None) -> dict:
    """Train (resuming its last checkpoint if any), evaluate, and record the run in one transaction.

    `lock`: the run's lock (`claim`); an `accelerate launch` child shares it, so that the run stays
    claimed while the child trains even if this process dies first.
    """
    from .config import save_config
    from .training import train
    from .utils import now_iso, versions

    started = now_iso()
    t0 = time.time()
    with conn:
        conn.execute(
            "INSERT INTO runs (name, method, seed, dataset, train_size, config_hash, config_json, output_dir, "
            "status, started) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'running', ?) ON CONFLICT(name) DO UPDATE SET "
            "config_hash=excluded.config_hash, config_json=excluded.config_json, status='running', "
            "started=excluded.started",
            (run.name, run.method, run.seed, run.dataset, run.train_size, run.config_hash,
             json.dumps(run.config.to_dict()), str(run.output_dir), started))
    resumable = (run.output_dir / "checkpoints" / "last" / "trainer_state.json").is_file() and not fresh
    _run_folder(run)
    save_config(run.config, run.output_dir / "run_config.yaml")
    if launcher == "accelerate":
        exe = Path(sys.executable).parent / "accelerate"  # the one installed beside this posbias
        cmd = [str(exe) if exe.is_file() else "accelerate", "launch", *accelerate_args.split(),
               "-m", "posbias", "train", run.config.task, "-c", str(run.output_dir / "run_config.yaml"),
               "--resume" if resumable else "--overwrite"]
        r = subprocess.run(cmd, pass_fds=(lock,) if lock is not None and fcntl is not None else ())
        if r.returncode != 0:
            raise RunError(f"run {run.name}: `{' '.join(cmd)}` exited with {r.returncode}; "
                           "run the experiment again to resume it")
        summary = json.loads((run.output_dir / "run_info.json").read_text(encoding="utf-8"))["summary"]
    else:
        summary = train(run.config, resume="auto" if resumable else None, overwrite=not resumable,
                        progress=progress)
    results = collect_results(exp, run)
    with conn:  # one transaction: a run is recorded whole or not at all
        for table in ("segments", "question_scores", "curves"):
            conn.execute(f"DELETE FROM {table} WHERE run = ?", (run.name,))
        # OR REPLACE: a key twice in a run's files (e.g. a log written by two processes at once by
        # an older posbias) keeps its last row instead of failing the record, and every later one.
        conn.executemany("INSERT OR REPLACE INTO question_scores VALUES (?, ?, ?, ?, ?)",
                         [(run.name, es, q, em, f1) for es, scores in results["questions"].items()
                          for q, (em, f1) in scores.items()])
        conn.executemany("INSERT OR REPLACE INTO segments VALUES (?, ?, ?, ?, ?, ?, ?)",
                         [(run.name, *row) for row in results["segments"]])
        conn.executemany("INSERT OR REPLACE INTO curves VALUES (?, ?, ?, ?)",
                         [(run.name, *row) for row in results["curves"]])
        conn.execute("UPDATE runs SET status='finished', finished=?, wall_seconds=?, train_seconds=?, "
                     "metrics_json=?, versions_json=? WHERE name=?",
                     (now_iso(), time.time() - t0, summary.get("train_seconds"),
                      json.dumps(results["metrics"]), json.dumps(results["versions"] or versions()), run.name))
    return results


def collect_results(exp: Experiment, run: Run) -> dict:
    """Metrics, per-example scores, segment metrics and learning curves of a trained run, and the
    versions its training recorded when it (re)started (`run_info.json`): the code that trained it,
    not the checkout's now, which may have moved on while it trained.

    The validation set is the run's `data.eval_file` (scored during training by its best
    checkpoint); each of the experiment's `eval_sets` is scored now with that checkpoint.
    """
    from .checkpoint import eval_config
    from .tasks import get_task

    task = get_task(run.config.task)
    out = run.output_dir
    info = json.loads((out / "run_info.json").read_text(encoding="utf-8"))
    sets = {}
    if run.config.data.eval_file:
        sets["val"] = (run.config.data.eval_file, out / "eval")
    for name, path in exp.eval_sets.items():
        target = out / "evals" / name
        if not (target / "metrics.json").is_file():
            # Eval sets are scored whole: data.max_eval_examples caps only the validation set.
            task.evaluate_checkpoint(out / "best", path, target, progress=False,
                                     overrides=["data.max_eval_examples=null", f"train.device={run.config.train.device}"])
        sets[name] = (path, target)
    metrics, questions, segments = {}, {}, []
    for name, options in exp.position_eval.items():
        target = out / "position_eval" / name
        if not (target / "diagnosis.json").is_file():
            task.position_eval_checkpoint(out / "best", exp.eval_sets[name], target,
                                          {k: v for k, v in options.items() if k != "alphas"},
                                          overrides=[f"train.device={run.config.train.device}"])
        result = json.loads((target / "diagnosis.json").read_text(encoding="utf-8"))
        metrics[f"{name} D*(k)"] = task.position_metrics(result, options.get("alphas", (5, 10)))
    for name, (path, folder) in sets.items():
        # The validation set as training read it; eval sets whole, as they were scored.
        ds = task.read(path, run.config if name == "val" else eval_config(run.config, None))
        if name == "val" and run.config.data.max_eval_examples:
            ds.examples = ds.examples[: run.config.data.max_eval_examples]
        metrics[name] = json.loads((folder / "metrics.json").read_text(encoding="utf-8"))
        scores = task.example_scores(ds, folder, info)
        questions[name] = scores
        for seg_name, seg_fn, seg_options in exp.segments:
            labels = SEGMENTERS.get(seg_fn)(ds.examples, folder, out / "best", **seg_options)
            for label in sorted(set(labels.values())):
                qids = [q for q, lab in labels.items() if lab == label and q in scores]
                em = sum(scores[q][0] for q in qids) / max(len(qids), 1) * 100
                f1 = sum(scores[q][1] for q in qids) / max(len(qids), 1) * 100
                segments.append((name, seg_name, str(label), len(qids), em, f1))
    curves = {}  # (kind, step) -> value: a step logged twice counts once, with its last value
    for r in _log_records(out / "train_log.jsonl"):
        curves["loss", r["step"]] = r["loss"]
        for k, v in (r.get("stats") or {}).items():  # the model's training scalars (learned-mixin gate)
            curves[k, r["step"]] = v
    for r in _log_records(out / "eval_log.jsonl"):
        name, value = task.main_metric(r)
        curves[f"val_{name}", r["step"]] = value
    curves.update(position_update_curve(out / "position_updates.json"))
    return {"metrics": metrics, "questions": questions, "segments": segments,
            "curves": [(kind, step, value) for (kind, step), value in curves.items()],
            "versions": info.get("versions")}


def position_update_curve(path: Path) -> dict:
    """A run's position-embedding updates as curve points: ("position_updates", position id) -> the
    fraction of optimizer steps in which that id got a gradient. Kept in the store (not only in the
    run folder), so an archive made by `experiment copy` still holds the positions each run trained.
    No points for a run that wrote no counts; a damaged file counts as none."""
    from .analysis.updates import PositionUpdateCounter

    try:
        fractions = PositionUpdateCounter.fractions(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return {("position_updates", i): float(f) for i, f in enumerate(fractions)}


def _log_records(path: Path) -> list[dict]:
    """The records of a JSON-lines log (none if it is missing); a line cut short by a crash is skipped."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def copy_results(src_dir, dest_dir, *, force: bool = False) -> dict:
    """Copy the finished runs' results (not their checkpoints) of one experiment folder into another.

    Archives a grid's results next to its report (a few MB instead of GBs of checkpoints), restores
    them into a working folder (where `experiment run` then skips those runs), or joins the stores
    of machines that each ran a part of a grid with `--only`. A run finished in both with a different
    config hash is refused unless `force`. The copy is one write transaction on the destination's
    store (`connect`: the store's lock, as a recording run takes it), merged into the records there:
    a grid running in the destination meanwhile waits for it and loses no record, and an
    interruption leaves the store as it was. The source's experiment.yaml replaces the destination's
    ("spec": "copied", "replaced", None when equal or absent), except while a grid runs there
    ("kept": its runner owns the spec).
    """
    from .utils import atomic_write_text

    src_dir, dest_dir = Path(src_dir), Path(dest_dir)
    src_db = src_dir / "experiment.sqlite"
    if not src_db.is_file():
        raise ConfigError(f"{src_dir} holds no experiment.sqlite (run `posbias experiment run` first)")
    if src_dir.resolve() == dest_dir.resolve():
        raise ConfigError(f"experiment copy: source and destination are the same folder ({src_dir})")
    outputs.claim_folder(dest_dir, "experiment copy: destination")
    dest_db = outputs.no_link(dest_dir / "experiment.sqlite", "experiment copy")
    with closing(connect(dest_db)) as work, readable_store(dest_db), \
            readable_store(src_db), closing(open_for_reading(src_db)) as src:
        check_store(src, src_db)
        with work:  # BEGIN IMMEDIATE: the destination store's write lock, for the whole copy
            finished = src.execute("SELECT * FROM runs WHERE status = 'finished' ORDER BY name").fetchall()
            columns = [c[0] for c in src.execute("SELECT * FROM runs LIMIT 0").description]
            conflicts = []
            for row in finished:
                name, h = row[0], row[columns.index("config_hash")]
                old = work.execute("SELECT status, config_hash FROM runs WHERE name = ?", (name,)).fetchone()
                if old and old[0] == "finished" and old[1] != h:
                    conflicts.append(name)
            if conflicts and not force:
                raise ConfigError(f"experiment copy: run {conflicts[0]} is finished in both {src_dir} and {dest_dir} "
                                  f"with different configs ({len(conflicts)} run(s) in all); pass --force to "
                                  "replace the destination's")
            for row in finished:
                work.execute("DELETE FROM runs WHERE name = ?", (row[0],))
                work.execute(f"INSERT INTO runs ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})", row)
                for table in ("segments", "question_scores", "curves"):
                    work.execute(f"DELETE FROM {table} WHERE run = ?", (row[0],))
                    rows = src.execute(f"SELECT * FROM {table} WHERE run = ?", (row[0],)).fetchall()
                    if rows:
                        work.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(rows[0]))})", rows)
                # A run recorded before the store kept position updates: take them from its folder
                # while it is still there.
                if not work.execute("SELECT 1 FROM curves WHERE run = ? AND kind = 'position_updates' LIMIT 1",
                                    (row[0],)).fetchone():
                    out = row[columns.index("output_dir")]
                    points = position_update_curve(Path(out) / "position_updates.json") if out else {}
                    work.executemany("INSERT INTO curves VALUES (?, ?, ?, ?)",
                                     [(row[0], kind, step, value) for (kind, step), value in points.items()])
    # The source's spec comes along, as `experiment run` rewrites a folder's spec on every run: an
    # archive refreshed while its grid grows (an arm added) then names the new arms too.
    spec_src, spec_dest, spec = src_dir / "experiment.yaml", dest_dir / "experiment.yaml", None
    if spec_src.is_file():
        text = spec_src.read_text(encoding="utf-8")
        if not spec_dest.is_file():
            spec = "copied"
        elif spec_dest.read_text(encoding="utf-8") != text:
            spec = "kept" if grid_running(dest_dir) else "replaced"
        if spec in ("copied", "replaced"):
            atomic_write_text(spec_dest, text)
    return {"source": str(src_dir), "destination": str(dest_dir), "copied": [r[0] for r in finished],
            "replaced": conflicts, "spec": spec}


def grid_running(exp_dir) -> bool:
    """Whether a live process holds one of the folder's run locks (`claim`): a grid runs there."""
    for path in sorted((Path(exp_dir) / "locks").rglob("*.lock")):
        if path.is_symlink() or not path.is_file():
            continue
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:
            continue
        try:
            if not _try_lock(fd):
                return True
        finally:
            os.close(fd)  # closing ends the lock taken to look
    return False


# -------------------------------------------------------------------------------------- aggregation
def load_results(exp_dir, *, only: list[str] | None = None, baseline: str | None = None) -> dict:
    """Everything the report needs, read from `<exp_dir>/experiment.sqlite`. `only`: shell patterns
    of run names (e.g. 'n512/*') to keep; `baseline`: the method Δs are taken against (default: the
    spec's `baseline`, else its first method)."""
    db = Path(exp_dir) / "experiment.sqlite"
    if not db.is_file():
        raise ConfigError(f"{exp_dir} holds no experiment.sqlite (run `posbias experiment run` first)")
    spec = load_yaml(Path(exp_dir) / "experiment.yaml") if (Path(exp_dir) / "experiment.yaml").is_file() else {}
    with readable_store(db), closing(open_for_reading(db)) as conn:
        check_store(conn, db)
        conn.row_factory = sqlite3.Row
        runs = [dict(r) for r in conn.execute("SELECT * FROM runs ORDER BY name")]
        segments = [dict(r) for r in conn.execute("SELECT * FROM segments")]
        curves = [dict(r) for r in conn.execute("SELECT * FROM curves ORDER BY run, kind, step")]
        questions = [dict(r) for r in conn.execute("SELECT * FROM question_scores")]
    for r in runs:
        r["metrics"] = json.loads(r["metrics_json"]) if r["metrics_json"] else {}
    if only:
        runs = [r for r in runs if any(fnmatchcase(r["name"], p) for p in only)]
        if not runs:
            raise ConfigError(f"--only {' '.join(only)} matches none of the runs in {db}")
        kept = {r["name"] for r in runs}
        segments, curves, questions = ([row for row in rows if row["run"] in kept]
                                       for rows in (segments, curves, questions))
    present = {r["method"] for r in runs}
    methods = [m for m in (spec.get("methods") or {}) if m in present] or sorted(present)
    if baseline is None:
        baseline = spec.get("baseline", next(iter(spec.get("methods") or {}), methods[0] if methods else None))
    elif baseline not in present:
        raise ConfigError(f"--baseline {baseline}: no runs of that method in {db}"
                          + (f" matching --only {' '.join(only)}" if only else "") + f" (methods: {', '.join(methods)})")
    return {"name": spec.get("name", Path(exp_dir).name), "spec": spec, "runs": runs, "segments": segments,
            "curves": curves, "questions": questions, "methods": methods, "baseline": baseline}


# Report metric -> the keys it has in a metrics dict (QA v1 / v2, tagging NER / POS).
METRIC_KEYS = {"EM": ("exact_match", "exact"), "F1": ("f1",), "precision": ("precision",), "recall": ("recall",),
               "accuracy": ("accuracy",), "macro F1": ("macro_f1",), "sub-token F1": ("f1_seqeval_subtoken",)}


def metric_value(metrics: dict, name: str) -> float | None:
    """A report metric (EM, F1, precision, recall, accuracy, macro F1) of a QA or tagging result;
    a position-evaluation result names its own (`report`: [[name, key], ...], e.g. F1(10))."""
    if "report" in metrics:
        key = dict(metrics["report"]).get(name)
        return metrics.get(key) if key else None
    return next((metrics[k] for k in METRIC_KEYS[name] if k in metrics), None)


def report_metrics(metrics: dict) -> tuple[list[str], str]:
    """(the metrics a report shows for a result, the one per-example scores are paired on): QA
    EM + F1 (both, per question); NER F1, precision, recall; POS accuracy, macro F1 (and sub-token
    F1); a position
    evaluation its `report` list (no per-example scores: t-test over seeds only)."""
    if "report" in metrics:
        return [name for name, _ in metrics["report"]], "none"
    if "exact_match" in metrics or "exact" in metrics:
        return ["EM", "F1"], "per-question"
    if metrics.get("scheme") == "none":  # POS; the authors' sub-token F1 where the result has it
        return ["accuracy", "macro F1"] + (["sub-token F1"] if "f1_seqeval_subtoken" in metrics else []), "accuracy"
    return ["F1", "precision", "recall"], "F1"


def aggregate(results: dict, bootstrap_samples: int = 10_000) -> list[dict]:
    """Per dataset x train size x eval set x method x metric: mean ± std over seeds, and the
    difference to the baseline with a paired t-test over seeds and a paired bootstrap over examples:
    QA questions (EM and F1: means of per-question scores), tagging sentences (the main metric, a
    corpus-level ratio recomputed on each resample)."""
    import numpy as np

    from .analysis.stats import mean_std, paired_bootstrap, paired_bootstrap_ratio, paired_ttest

    finished = [r for r in results["runs"] if r["status"] == "finished"]
    per_q: dict = {}
    for q in results["questions"]:
        per_q.setdefault((q["run"], q["eval_set"]), {})[q["qid"]] = (q["exact"], q["f1"])
    groups: dict = {}
    for r in finished:
        for eval_set, m in r["metrics"].items():
            groups.setdefault((r["dataset"], r["train_size"], eval_set), {}).setdefault(r["method"], []).append(r)
    rows = []
    base = results["baseline"]
    for (dataset, size, eval_set), by_method in sorted(groups.items(), key=lambda kv: str(kv[0])):
        order = [m for m in results["methods"] if m in by_method] + sorted(set(by_method) - set(results["methods"]))
        names, paired = report_metrics(next(iter(by_method.values()))[0]["metrics"][eval_set])
        for metric_i, metric in enumerate(names):
            for method in order:
                rs = by_method[method]
                vals = {r["seed"]: metric_value(r["metrics"][eval_set], metric) for r in rs}
                vals = {s: v for s, v in vals.items() if v is not None}
                mean, std = mean_std(list(vals.values()))
                row = {"dataset": dataset, "train_size": size, "eval_set": eval_set, "metric": metric,
                       "method": method, "n_runs": len(vals), "mean": mean, "std": std,
                       "wall_seconds": sum(r["wall_seconds"] or 0 for r in rs), "seeds": sorted(vals)}
                if method != base and base in by_method:
                    bvals = {r["seed"]: metric_value(r["metrics"][eval_set], metric) for r in by_method[base]}
                    bvals = {s: v for s, v in bvals.items() if v is not None}
                    row["ttest"] = paired_ttest(vals, bvals)
                    row["baseline_n_runs"] = len(bvals)
                    seeds = sorted(set(vals) & set(bvals))
                    mq = [per_q.get((_run_of_seed(rs, s), eval_set), {}) for s in seeds]
                    bq = [per_q.get((_run_of_seed(by_method[base], s), eval_set), {}) for s in seeds]
                    qids = sorted(set.intersection(*[set(x) for x in mq + bq])) if seeds else []
                    if qids and paired == "per-question":
                        mm = np.mean([[x[q][metric_i] for q in qids] for x in mq], axis=0) * 100
                        bb = np.mean([[x[q][metric_i] for q in qids] for x in bq], axis=0) * 100
                        row["bootstrap"] = paired_bootstrap(mm, bb, samples=bootstrap_samples)
                    elif qids and metric == paired:
                        # (numerator, denominator) per sentence, pooled over seeds
                        mm = np.sum([[x[q] for q in qids] for x in mq], axis=0)
                        bb = np.sum([[x[q] for q in qids] for x in bq], axis=0)
                        row["bootstrap"] = paired_bootstrap_ratio(mm, bb, samples=bootstrap_samples)
                rows.append(row)
    return rows


def _run_of_seed(runs: list[dict], seed: int) -> str | None:
    return next((r["name"] for r in runs if r["seed"] == seed), None)


def _eval_examples(results: dict, run: dict, eval_set: str):
    """The examples a run was scored on for `eval_set` (the validation set capped as in training)."""
    from .tasks import get_task

    cfg = json.loads(run["config_json"])
    spec = cfg["data"]["eval_file"] if eval_set == "val" else (results["spec"].get("eval_sets") or {}).get(eval_set)
    if spec is None:
        return None
    ds = get_task(cfg.get("task", "qa")).read(spec, build_config(cfg, saved=True))
    if eval_set == "val" and cfg["data"].get("max_eval_examples"):
        ds.examples = ds.examples[: cfg["data"]["max_eval_examples"]]
    return ds.examples


def gold_segment_labels(results: dict) -> dict:
    """(run, eval set, segmenter label) -> {qid: segment} for the segmenters whose segments depend on
    the gold answers only (`SEGMENTERS` functions marked `gold_only`): the same questions for every
    method, so a paired bootstrap over them is meaningful. Computed from each run's tokenizer and
    data settings (cached: methods that share them share the labels)."""
    specs = [_segment_spec(s, i) for i, s in enumerate(results["spec"].get("segments") or [])]
    specs = [(label, name, opts) for label, name, opts in specs if getattr(SEGMENTERS.get(name), "gold_only", False)]
    if not specs:
        return {}
    present = {(s["run"], s["eval_set"], s["segmenter"]) for s in results["segments"]}
    out, cache, examples = {}, {}, {}
    for run in (r for r in results["runs"] if r["status"] == "finished"):
        cfg = json.loads(run["config_json"])
        d = cfg["data"]
        setting = json.dumps([cfg["model"]["name_or_path"], cfg["model"].get("tokenizer"), d["max_seq_len"],
                              d["doc_stride"], d["max_query_len"], d.get("context_first")])
        for eval_set in run["metrics"]:
            for label, name, opts in specs:
                if (run["name"], eval_set, label) not in present:
                    continue
                key = (setting, eval_set, label, eval_set == "val" and d.get("max_eval_examples"))
                if key not in cache:
                    ek = (eval_set, key[3])
                    if ek not in examples:
                        examples[ek] = _eval_examples(results, run, eval_set)
                    best = Path(run["output_dir"]) / "best"
                    # Token positions need the run's tokenizer; answer sentences and lengths need only text.
                    needs_best = getattr(SEGMENTERS.get(name), "needs_checkpoint", True)
                    if examples[ek] is None or (needs_best and not best.is_dir()):
                        continue
                    cache[key] = SEGMENTERS.get(name)(examples[ek], None, best, **opts)
                out[(run["name"], eval_set, label)] = cache[key]
    return out


def aggregate_segments(results: dict, bootstrap_samples: int = 10_000) -> list[dict]:
    """Per eval set x segmenter x segment x method: F1/EM mean ± std over seeds, and the paired
    t-test of the F1 difference to the baseline; for gold-only segmenters (the same questions for
    every method) also the paired bootstrap over the segment's questions."""
    from .analysis.stats import mean_std, paired_ttest

    runs = {r["name"]: r for r in results["runs"] if r["status"] == "finished"}
    labels = gold_segment_labels(results) if bootstrap_samples else {}
    per_q: dict = {}
    for q in results["questions"]:
        per_q.setdefault((q["run"], q["eval_set"]), {})[q["qid"]] = (q["exact"], q["f1"])
    cells: dict = {}
    for s in results["segments"]:
        r = runs.get(s["run"])
        if r is None:
            continue
        key = (r["dataset"], r["train_size"], s["eval_set"], s["segmenter"], s["segment"])
        cells.setdefault(key, {}).setdefault(r["method"], {})[r["seed"]] = s
    rows = []
    base = results["baseline"]
    for key, by_method in sorted(cells.items(), key=lambda kv: str(kv[0])):
        for method in [m for m in results["methods"] if m in by_method]:
            seeds = by_method[method]
            f1 = {k: v["f1"] for k, v in seeds.items()}
            mean, std = mean_std(list(f1.values()))
            em_mean, em_std = mean_std([v["exact"] for v in seeds.values()])
            row = dict(zip(("dataset", "train_size", "eval_set", "segmenter", "segment"), key),
                       method=method, n_runs=len(seeds), n_questions=max(v["n"] for v in seeds.values()),
                       f1_mean=mean, f1_std=std, em_mean=em_mean, em_std=em_std)
            if method != base and base in by_method:
                row["ttest"] = paired_ttest(f1, {k: v["f1"] for k, v in by_method[base].items()})
                row["baseline_n_runs"] = len(by_method[base])
                boot = _segment_bootstrap(key, method, by_method, base, labels, per_q, bootstrap_samples)
                if boot is not None:
                    row["bootstrap"] = boot
            rows.append(row)
    return rows


def _segment_bootstrap(key, method, by_method, base, labels, per_q, samples):
    """Paired bootstrap of F1 over the questions of one gold-only segment (scores averaged over seeds)."""
    from .analysis.stats import paired_bootstrap

    _, _, eval_set, segmenter, segment = key
    seeds = sorted(set(by_method[method]) & set(by_method[base]))
    pairs = [(by_method[method][s]["run"], by_method[base][s]["run"]) for s in seeds]
    qsets = []
    for m_run, b_run in pairs:
        lm, lb = labels.get((m_run, eval_set, segmenter)), labels.get((b_run, eval_set, segmenter))
        if lm is None or lb is None:
            return None
        qsets.append({q for q, lab in lm.items() if str(lab) == segment} & {q for q, lab in lb.items() if str(lab) == segment}
                     & set(per_q.get((m_run, eval_set), {})) & set(per_q.get((b_run, eval_set), {})))
    qids = sorted(set.intersection(*qsets)) if qsets else []
    if not qids:
        return None
    mm = np.mean([[per_q[(m, eval_set)][q][1] for q in qids] for m, _ in pairs], axis=0) * 100
    bb = np.mean([[per_q[(b, eval_set)][q][1] for q in qids] for _, b in pairs], axis=0) * 100
    return paired_bootstrap(mm, bb, samples=samples)

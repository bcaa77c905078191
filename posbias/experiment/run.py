"""Running a grid: `run_experiment` trains, evaluates and records every unfinished run of a spec, in
this process or through `accelerate launch`, taking each run's lock first (`posbias.experiment.store`);
with `record=False` (a cluster job's `--no-store`) it trains and scores runs in their folders and
leaves the store to `collect_experiment`, which never trains: it records the runs whose training
finished and lists the others. `plan` lists the runs with the command that runs each on its own.
"""
from __future__ import annotations

import glob
import json
import shlex
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from fnmatch import fnmatchcase
from pathlib import Path

import yaml

from .. import outputs
from ..config import load_yaml, save_config
from ..devices import check_device_spec
from ..errors import ConfigError, RunError
from ..interrupt import stop_on_signals
from ..utils import atomic_write_json, atomic_write_text, now_iso, versions
from .collect import collect_results, score_run
from .spec import Experiment, Run, load_experiment
from .store import claim, connect, holder, lock_fds, readable_store, release, run_status


def plan(exp: Experiment, launcher: str = "local", accelerate_args: str = "",
         device: str | None = None) -> list[dict]:
    """The expanded run list, with the command that runs each run on its own (a cluster job): an
    `experiment run --only <run> --no-store` of the experiment folder's spec (its experiment.yaml),
    which takes the run's lock, trains and scores it in its folder, and leaves the store to
    `posbias experiment collect`."""
    spec_file = exp.output_dir.resolve() / "experiment.yaml"
    common = ["--output-dir", str(exp.output_dir.resolve()), "--no-store", "--no-wait"]
    if device is not None:
        common += ["--device", device]
    if launcher == "accelerate":
        common += ["--launcher", "accelerate"] + (["--accelerate-args", accelerate_args] if accelerate_args else [])
    rows = []
    for run in exp.runs:
        # glob.escape: the name as a pattern that matches itself only (a method may hold `[` or `*`)
        cmd = shlex.join(["posbias", "experiment", "run", str(spec_file), *common, "--only", glob.escape(run.name)])
        rows.append({"name": run.name, "method": run.method, "seed": run.seed, "dataset": run.dataset,
                     "train_size": run.train_size, "config_hash": run.config_hash,
                     "output_dir": str(run.output_dir), "command": cmd})
    return rows


def select(spec, output_dir=None, *, only: list[str] | None = None, device: str | None = None) -> Experiment:
    """The experiment of a spec, cut to the runs `only` (shell patterns of run names) matches, each
    run's train.device set to `device` (not part of a run's config hash) when given."""
    exp = load_experiment(spec, output_dir)
    if device is not None:  # where runs train and are evaluated; not part of a run's config hash
        check_device_spec(device, "--device")
        for run in exp.runs:
            run.config.train.device = device
    if only:
        picked = [r for r in exp.runs if any(fnmatchcase(r.name, p) for p in only)]
        if not picked:
            raise ConfigError(f"--only {' '.join(only)} matches none of the runs of {exp.name} "
                              f"({', '.join(r.name for r in exp.runs[:6])}{', ...' if len(exp.runs) > 6 else ''})")
        exp.runs = picked
    return exp


def run_experiment(spec, output_dir: str | None = None, *, launcher: str = "local",
                   accelerate_args: str = "", dry_run: bool = False, force: bool = False,
                   progress: bool = True, only: list[str] | None = None, wait: bool = True,
                   device: str | None = None, record: bool = True) -> dict:
    """Run every unfinished run of the grid; finished runs are skipped, interrupted ones resumed.

    A run whose config changed since it was recorded is refused (all are checked before anything
    runs) unless `force`, which redoes it from scratch. `only`: shell patterns of run names (e.g.
    `cp/*`, `rpp/seed2`); the other runs are left alone. Several processes may run one grid at once
    (see "Sharing a store" in `posbias.experiment.store`): a run another process holds is left to
    it, and then waited for unless `wait` is False (it is taken over if its holder dies before
    finishing it).

    `record=False` (`--no-store`, a cluster job's command): the runs are trained and scored in their
    folders under their locks, but the store is not touched (SQLite is not to be shared across the
    nodes of a cluster); `collect_experiment` records them. A run whose folder says its training
    finished with this config is not trained again (`skipped_finished`).

    Returns the runs this process trained (`ran`), found finished (`skipped_finished`), saw finished
    by other processes (`finished_by_others`) and, without `wait`, left to them (`left_to_others`).
    """
    if launcher not in ("local", "accelerate"):
        raise ConfigError(f"--launcher must be local, accelerate or submitit, got {launcher!r}"
                          if launcher != "submitit" else "--launcher submitit: use posbias.experiment_run "
                          "(or posbias.experiment.cluster.submit_runs); run_experiment runs in this process")
    exp = select(spec, output_dir, only=only, device=device)
    if dry_run:
        # Each run's config and the spec are written so that the printed commands work as they are,
        # e.g. as the jobs of a cluster; `experiment collect` then records the finished runs.
        outputs.claim_folder(exp.output_dir, "experiment output_dir")
        save_spec(exp, spec)
        for run in exp.runs:
            _run_folder(run)
            save_config(run.config, run.output_dir / "run_config.yaml")
        return {"experiment": exp.name, "output_dir": str(exp.output_dir),
                "runs": plan(exp, launcher, accelerate_args, device)}
    outputs.claim_folder(exp.output_dir, "experiment output_dir")  # new, empty or posbias's own
    outcome: dict[str, list[str]] = {"ran": [], "skipped_finished": [], "finished_by_others": []}
    options = {"force": force, "launcher": launcher, "accelerate_args": accelerate_args, "progress": progress}
    if not record:
        return _run_unrecorded(exp, outcome, wait=wait, **options)
    save_spec(exp, spec)
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


def _run_unrecorded(exp: Experiment, outcome: dict, *, wait: bool, **options) -> dict:
    """`run_experiment(record=False)`: each run trained (or found trained) and scored under its lock,
    in its folder only; a run another process holds is left to it, or waited for."""
    held = []
    for i, run in enumerate(exp.runs):
        lock = claim(exp.output_dir, run.name)
        if lock is None:
            print(f"[{i + 1}/{len(exp.runs)}] {run.name}: held by {holder(exp.output_dir, run.name)}, left to it",
                  file=sys.stderr, flush=True)
            held.append(run)
            continue
        outcome[_train_claimed(exp, run, lock, f"[{i + 1}/{len(exp.runs)}] {run.name}", **options)].append(run.name)
    while held and wait:
        for run in list(held):
            if (lock := claim(exp.output_dir, run.name)) is not None:
                held.remove(run)
                outcome[_train_claimed(exp, run, lock, f"[taken over] {run.name}", **options)].append(run.name)
        if held:
            time.sleep(0.5)
    return {"experiment": exp.name, "output_dir": str(exp.output_dir), **outcome,
            "left_to_others": [r.name for r in held]}


def _train_claimed(exp: Experiment, run: Run, lock: int, label: str, *, force: bool, **options) -> str:
    """With the run's lock held and no store: train it unless its folder says its training finished
    with this config ("skipped_finished"; "ran" otherwise), score its eval sets, let the lock go."""
    try:
        info = trained_info(run)
        old_hash = info.get("config_hash") if info else None
        if old_hash is not None and old_hash != run.config_hash and not force:
            raise _changed_error(exp, [run.name])
        if info is not None and info.get("status") == "finished" and old_hash == run.config_hash:
            key = "skipped_finished"
        else:
            print(label, file=sys.stderr, flush=True)
            _train(run, fresh=old_hash not in (None, run.config_hash), lock=lock, **options)
            key = "ran"
        score_run(exp, run)  # here, in the process (the job, the GPU) that trained it
        return key
    finally:
        release(lock)


def trained_info(run: Run) -> dict | None:
    """The run's run_info.json (what its training last wrote: status, config_hash), or None when
    there is none or it cannot be read (a training that never started, or died writing it)."""
    try:
        info = json.loads((run.output_dir / "run_info.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def collect_experiment(spec, output_dir=None, *, only: list[str] | None = None) -> dict:
    """Record into the store every run whose training finished (trained by cluster jobs, `--no-store`
    or `posbias train` of its run_config.yaml) and list the others; never trains. A run is looked at
    only under its lock: one a live process holds (a job training it) is listed, not touched.

    Returns `finished` (recorded before), `collected` (recorded now) and `unfinished`: one
    {"name", "status", "holder"} per run whose training has not finished, its status `running`
    (its lock is held: `holder` says by whom), `interrupted` or `failed` (its run_info.json), `not
    started`, or `changed` (recorded or trained with another config: `experiment run --force`).
    """
    exp = select(spec, output_dir, only=only)
    outputs.claim_folder(exp.output_dir, "experiment output_dir")
    result = {"experiment": exp.name, "output_dir": str(exp.output_dir), "finished": [], "collected": [],
              "unfinished": []}
    with closing(connect(exp.db_path)) as conn, readable_store(exp.db_path):
        for run in exp.runs:
            status, old_hash = run_status(conn, run.name)
            if status == "finished" and old_hash == run.config_hash:
                result["finished"].append(run.name)
                continue
            lock = claim(exp.output_dir, run.name)
            if lock is None:
                result["unfinished"].append({"name": run.name, "status": "running",
                                             "holder": holder(exp.output_dir, run.name)})
                continue
            try:
                status, old_hash = run_status(conn, run.name)  # again, under the lock
                info = trained_info(run)
                if status == "finished" and old_hash == run.config_hash:
                    result["finished"].append(run.name)
                elif (old_hash not in (None, run.config_hash)
                      or (info is not None and info.get("config_hash") not in (None, run.config_hash))):
                    result["unfinished"].append({"name": run.name, "status": "changed", "holder": None})
                elif info is not None and info.get("status") == "finished":
                    print(f"collecting {run.name}", file=sys.stderr, flush=True)
                    summary = info.get("summary") or {}
                    _record(run, conn, collect_results(exp, run), summary, info,
                            wall_seconds=summary.get("wall_seconds"))
                    result["collected"].append(run.name)
                else:  # a run_info.json `running` whose lock is free: its process died
                    why = {None: "not started", "running": "interrupted"}.get(info and info.get("status"),
                                                                               info and info.get("status"))
                    result["unfinished"].append({"name": run.name, "status": why, "holder": None})
            finally:
                release(lock)
    return result


def _changed_error(exp: Experiment, changed: list[str]) -> ConfigError:
    return ConfigError(
        f"experiment {exp.name}: the config of run {changed[0]} changed since it was recorded "
        f"({len(changed)} run(s) in all); use a new output_dir, revert the spec, or pass --force "
        "to redo them")


def _run_claimed(exp: Experiment, run: Run, conn, lock: int, label: str, *, force: bool, **options) -> str:
    """With the run's lock held: read its record again (another process may have finished it since
    the first look: "finished_by_others"), else train and record it ("ran"); then let the lock go.
    While its store row says `running`, SIGTERM and SIGINT end it `interrupted` (`posbias.interrupt`;
    its training saves its checkpoint first), not killed with the row left `running`."""
    try:
        status, old_hash = run_status(conn, run.name)
        if status == "finished" and old_hash == run.config_hash:
            return "finished_by_others"
        if old_hash is not None and old_hash != run.config_hash and not force:
            raise _changed_error(exp, [run.name])  # recorded with another config by another process meanwhile
        print(label, file=sys.stderr, flush=True)
        try:
            with stop_on_signals():
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


def save_spec(exp: Experiment, spec) -> None:
    """The spec as `<output_dir>/experiment.yaml`: what the report reads, and what the printed job
    commands (`plan`) and `experiment collect FOLDER` load, from the experiment folder."""
    d = load_yaml(spec) if not isinstance(spec, dict) else dict(spec)
    d["baseline"] = exp.baseline  # explicit, so the report never depends on key order
    base, spec_dir = d.get("base"), Path(spec).resolve().parent if not isinstance(spec, dict) else Path.cwd()
    if isinstance(base, str) and (spec_dir / base).is_file():  # a base file next to the spec, as load_experiment
        d["base"] = str((spec_dir / base).resolve())           # reads it: the same file from the folder's copy
    atomic_write_text(exp.output_dir / "experiment.yaml", yaml.safe_dump(d, sort_keys=False))


def execute_run(exp: Experiment, run: Run, conn, *, fresh: bool = False, launcher: str = "local",
                accelerate_args: str = "", progress: bool = True, lock: int | None = None) -> dict:
    """Train (resuming its last checkpoint if any), evaluate, and record the run in one transaction.

    `lock`: the run's lock (`claim`); an `accelerate launch` child shares it, so that the run stays
    claimed while the child trains even if this process dies first.
    """
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
    summary = _train(run, fresh=fresh, launcher=launcher, accelerate_args=accelerate_args, progress=progress,
                     lock=lock)
    results = collect_results(exp, run)
    _record(run, conn, results, summary, wall_seconds=time.time() - t0)
    return results


def _train(run: Run, *, fresh: bool, launcher: str = "local", accelerate_args: str = "", progress: bool = True,
           lock: int | None = None) -> dict:
    """Train the run in its folder, resuming its last checkpoint unless `fresh`; its summary."""
    from ..training import train  # loads torch and the tasks: on first use

    if run.checkpoint is not None:
        return _scored_elsewhere(run)
    resumable = (run.output_dir / "checkpoints" / "last" / "trainer_state.json").is_file() and not fresh
    _run_folder(run)
    save_config(run.config, run.output_dir / "run_config.yaml")
    if launcher == "accelerate":
        exe = Path(sys.executable).parent / "accelerate"  # the one installed beside this posbias
        cmd = [str(exe) if exe.is_file() else "accelerate", "launch", *accelerate_args.split(),
               "-m", "posbias", "train", run.config.task, "-c", str(run.output_dir / "run_config.yaml"),
               "--resume" if resumable else "--overwrite"]
        r = subprocess.run(cmd, pass_fds=lock_fds(lock))
        if r.returncode != 0:
            raise RunError(f"run {run.name}: `{' '.join(cmd)}` exited with {r.returncode}; "
                           "run the experiment again to resume it")
        return json.loads((run.output_dir / "run_info.json").read_text(encoding="utf-8"))["summary"]
    return train(run.config, resume="auto" if resumable else None, overwrite=not resumable, progress=progress)


def _scored_elsewhere(run: Run) -> dict:
    """A run of a method with `checkpoint:`: nothing to train. Its folder gets the run_info.json a
    finished training writes (the model it scores, the config hash, the versions), so that scoring,
    collecting and `--no-store` jobs treat it as any finished run; its summary."""
    from ..checkpoint import checkpoint_task  # loads torch: on first use

    model = run.checkpoint
    try:
        task = checkpoint_task(model)  # a folder, or a Hub id in the local cache
    except ConfigError as e:
        raise ConfigError(f"run {run.name}: checkpoint: {e}") from None
    if task != run.config.task:
        raise ConfigError(f"run {run.name}: checkpoint {model} is a {task} model; the experiment's runs are "
                          f"{run.config.task}")
    _run_folder(run)
    save_config(run.config, run.output_dir / "run_config.yaml")
    summary = {"output_dir": str(run.output_dir), "steps": None, "best_step": None, "train_seconds": 0.0,
               "checkpoint": model, **({"decode": run.decode} if run.decode else {})}
    info = {"status": "finished", "started": now_iso(), "finished": now_iso(), "config_hash": run.config_hash,
            "checkpoint": model, **({"decode": run.decode} if run.decode else {}), "seed": run.config.train.seed,
            "versions": versions(), "summary": summary}
    atomic_write_json(run.output_dir / "run_info.json", info)
    return summary


def _record(run: Run, conn, results: dict, summary: dict, info: dict | None = None, *,
            wall_seconds: float | None = None) -> None:
    """The run's results into the store, in one transaction: a run is recorded whole or not at all.
    `info`: the run_info.json of a run trained elsewhere (its start and finish times are the run's)."""
    with conn:
        if info is not None:  # trained by another process (a job): its row is written here
            conn.execute(
                "INSERT INTO runs (name, method, seed, dataset, train_size, config_hash, config_json, output_dir, "
                "status, started) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'running', ?) ON CONFLICT(name) DO UPDATE SET "
                "config_hash=excluded.config_hash, config_json=excluded.config_json, status='running', "
                "started=excluded.started",
                (run.name, run.method, run.seed, run.dataset, run.train_size, run.config_hash,
                 json.dumps(run.config.to_dict()), str(run.output_dir), info.get("started") or now_iso()))
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
        conn.execute("DELETE FROM copy_scores WHERE run = ?", (run.name,))
        conn.executemany("INSERT INTO copy_scores VALUES (?, ?, ?)",
                         [(run.name, es, data) for es, data in (results.get("copies") or {}).items()])
        conn.execute("UPDATE runs SET status='finished', finished=?, wall_seconds=?, train_seconds=?, "
                     "metrics_json=?, versions_json=? WHERE name=?",
                     ((info or {}).get("finished") or now_iso(), wall_seconds, summary.get("train_seconds"),
                      json.dumps(results["metrics"]), json.dumps(results["versions"] or versions()), run.name))

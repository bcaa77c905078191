"""A grid on several GPUs of one machine (`run_lanes`: one `experiment run` process per GPU on one
store) and on a Slurm cluster (`submit_runs`: one job per unfinished run through submitit).

Lanes share the store like any processes on one machine ("Sharing a store" in
`posbias.experiment.store`): each is an ordinary `posbias experiment run` that sees only its own GPU
(`CUDA_VISIBLE_DEVICES`), takes runs by their locks and records them. Cluster jobs may run on other
nodes, where SQLite is not to be shared: each job runs `run_experiment(only=<its run>, record=False)`
(the code path of the commands `--dry-run` prints) under the run's lock, training and scoring it in
its folder; `collect_experiment` then records the finished runs, from one process.
"""
from __future__ import annotations

import glob
import os
import subprocess
import sys
import threading
from contextlib import closing

from .. import outputs
from ..config import yaml_safe_load
from ..errors import ConfigError, RunError
from .run import collect_experiment, run_experiment, save_spec, select, trained_info
from .store import claim, connect, readable_store, release, run_status

CLUSTER_EXTRA = "pip install 'posbias[cluster]'"


def parse_gpus(text: str) -> list[str]:
    """`--gpus 0,1,2,3`: distinct GPU indices (as CUDA_VISIBLE_DEVICES names them), in order."""
    parts = [p.strip() for p in str(text).split(",")]
    if not parts or not all(p.isdigit() for p in parts):
        raise ConfigError(f"--gpus takes GPU indices separated by commas (e.g. 0,1,2,3), got {text!r}")
    if len(set(parts)) != len(parts):
        raise ConfigError(f"--gpus names a GPU twice: {text!r}")
    return [str(int(p)) for p in parts]


def _finished(exp) -> set[str]:
    """The runs of `exp` the store records finished with their current config."""
    if not exp.db_path.is_file():
        return set()
    with closing(connect(exp.db_path)) as conn, readable_store(exp.db_path):
        return {r.name for r in exp.runs if run_status(conn, r.name) == ("finished", r.config_hash)}


def _pipe(stream, prefix: str, out) -> None:
    for line in stream:
        out.write(prefix + line)
        out.flush()


def run_lanes(spec, output_dir=None, *, gpus, only: list[str] | None = None, force: bool = False,
              wait: bool = True, device: str | None = None, progress: bool = True) -> dict:
    """Run a grid with one lane per GPU: a `posbias experiment run` process per entry of `gpus`
    (indices, e.g. "0,1,2,3" or a list), each with `CUDA_VISIBLE_DEVICES` set to its GPU and
    `--device cuda` (its GPU; `device` overrides, e.g. cpu), all on one store. A lane's runs are
    trained, scored and recorded in that lane. Each lane's output comes through prefixed `[gpu N]`.

    Returns what `run_experiment` returns, for the grid: the runs the lanes finished (`ran`),
    found finished (`skipped_finished`) and did not finish (`left_to_others`: held by processes
    outside the lanes, with `wait=False`), and each lane's exit code (`lanes`).
    """
    gpus = parse_gpus(",".join(map(str, gpus)) if isinstance(gpus, (list, tuple)) else gpus)
    if device is not None and device.startswith("cuda:"):
        raise ConfigError(f"--device {device} names one GPU: with --gpus each lane sees only its own GPU "
                          "(as cuda:0); leave --device out or use --device cuda")
    exp = select(spec, output_dir, only=only, device=device)
    outputs.claim_folder(exp.output_dir, "experiment output_dir")
    save_spec(exp, spec)
    before = _finished(exp)
    cmd = [sys.executable, "-m", "posbias", *([] if progress else ["-q"]), "experiment", "run",
           str(exp.output_dir.resolve() / "experiment.yaml"), "--output-dir", str(exp.output_dir.resolve()),
           "--device", device or "cuda", *(["--force"] if force else []), *([] if wait else ["--no-wait"]),
           *(["--only", *[glob.escape(r.name) for r in exp.runs]] if only else [])]
    lanes, pipes = [], []
    try:
        for gpu in gpus:
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu}
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    bufsize=1)
            lanes.append((gpu, proc))
            pipes.append(threading.Thread(target=_pipe, args=(proc.stdout, f"[gpu {gpu}] ", sys.stderr), daemon=True))
            pipes[-1].start()
        codes = [proc.wait() for _, proc in lanes]
    finally:
        for _, proc in lanes:  # an interrupted or failed start: no lane outlives this process
            if proc.poll() is None:
                proc.terminate()
                proc.wait()
    for t in pipes:
        t.join(timeout=5)
    failed = [(gpu, code) for (gpu, _), code in zip(lanes, codes) if code != 0]
    if failed:
        raise RunError(f"experiment {exp.name}: the lane on GPU {failed[0][0]} exited with {failed[0][1]} "
                       f"({len(failed)} lane(s) failed; their lines above, [gpu N], say why); "
                       "run the same command again to resume")
    after = _finished(exp)
    return {"experiment": exp.name, "output_dir": str(exp.output_dir),
            "ran": [r.name for r in exp.runs if r.name in after - before],
            "skipped_finished": [r.name for r in exp.runs if r.name in before], "finished_by_others": [],
            "left_to_others": [r.name for r in exp.runs if r.name not in after],
            "lanes": {gpu: code for (gpu, _), code in zip(lanes, codes)}}


def parse_options(items) -> dict:
    """`--submitit KEY=VALUE ...` as submitit parameters, each value read as YAML (60 -> 60, gpu -> "gpu")."""
    out = {}
    for item in items or ():
        key, sep, value = str(item).partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--submitit takes KEY=VALUE items (e.g. slurm_partition=gpu timeout_min=240), "
                              f"got {item!r}")
        out[key.strip()] = yaml_safe_load(value, f"--submitit {key}") if value else None
    return out


def run_job(spec_file: str, output_dir: str, name: str, device: str | None = None, force: bool = False) -> dict:
    """A cluster job: the one run `name`, trained and scored in its folder under its lock (the
    command `--dry-run` prints, in this process), the store left to `collect_experiment`."""
    return run_experiment(spec_file, output_dir, only=[glob.escape(name)], record=False, wait=False,
                          device=device, force=force, progress=False)


def submit_runs(spec, output_dir=None, *, options: dict | None = None, only: list[str] | None = None,
                force: bool = False, wait: bool = True, device: str | None = None) -> dict:
    """Submit one submitit job per run that still needs training (a job array: `map_array`), each
    running `run_job`; with `wait`, wait for them and record the finished runs (`collect_experiment`).

    `options`: submitit's parameters (`AutoExecutor.update_parameters`: timeout_min, gpus_per_node,
    cpus_per_task, mem_gb, slurm_partition, slurm_array_parallelism, ...), plus `cluster` (slurm,
    local, debug; default: slurm where `sbatch` is found, else local). Job logs go to
    `<output_dir>/submitit/`.
    """
    try:
        import submitit
    except ImportError:
        raise ConfigError(f"--launcher submitit needs the submitit package: {CLUSTER_EXTRA}") from None
    options = dict(options or {})
    exp = select(spec, output_dir, only=only, device=device)
    outputs.claim_folder(exp.output_dir, "experiment output_dir")
    save_spec(exp, spec)
    finished = _finished(exp)
    todo, held = [], []
    for run in exp.runs:
        info = trained_info(run)
        if run.name in finished:
            continue
        if info is not None and info.get("config_hash") not in (None, run.config_hash) and not force:
            raise ConfigError(f"experiment {exp.name}: the config of run {run.name} changed since it was trained; "
                              "use a new output_dir, revert the spec, or pass --force to redo it")
        if info is not None and info.get("status") == "finished" and info.get("config_hash") == run.config_hash:
            continue  # trained: only to be recorded (below, or by `experiment collect`)
        lock = claim(exp.output_dir, run.name)
        if lock is None:  # a live process (an earlier job) has it
            held.append(run.name)
            continue
        release(lock)
        todo.append(run)
    cluster = options.pop("cluster", None)
    folder = exp.output_dir.resolve() / "submitit"
    try:
        executor = submitit.AutoExecutor(folder=folder, cluster=cluster)
        executor.update_parameters(**{"name": f"posbias-{exp.name}", **options})
    except (ValueError, NameError, AssertionError, TypeError, RuntimeError) as e:  # submitit's ways of refusing
        first = " ".join(str(e).split("\n")[0].split())
        raise ConfigError(f"--submitit {' '.join(f'{k}={v}' for k, v in options.items()) or '(none)'}"
                          f"{f' cluster={cluster}' if cluster else ''}: {first}") from None
    spec_file, out = str(exp.output_dir.resolve() / "experiment.yaml"), str(exp.output_dir.resolve())
    jobs = executor.map_array(run_job, [spec_file] * len(todo), [out] * len(todo), [r.name for r in todo],
                              [device] * len(todo), [force] * len(todo)) if todo else []
    for run, job in zip(todo, jobs):
        print(f"{run.name}: job {job.job_id}", file=sys.stderr, flush=True)
    result = {"experiment": exp.name, "output_dir": str(exp.output_dir), "folder": str(folder),
              "submitted": {r.name: j.job_id for r, j in zip(todo, jobs)}, "held": held}
    if not wait:
        return result
    failed = {}
    for run, job in zip(todo, jobs):
        try:
            job.result()
        except Exception as e:  # submitit's FailedJobError, UncompletedJobError: the job's log says why
            failed[run.name] = " ".join(str(e).split())[:300]
    result["failed"] = failed
    result.update(collect_experiment(spec_file, out, only=only))
    return result



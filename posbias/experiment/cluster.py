"""Grids beyond one process: lanes of processes on one machine, and jobs on a Slurm cluster.

One lane scheduler, `run_queue`: commands run as processes, at most K at once, in priority groups,
within an optional time budget (a run projected past it is stopped, lowest-priority group first).
Two ways to use it:
- `run_lanes`: one `experiment run` process per GPU of one machine, all on one store. Lanes share
  the store like any processes on one machine ("Sharing a store" in `posbias.experiment.store`):
  each is an ordinary `posbias experiment run` that sees only its own GPU (`CUDA_VISIBLE_DEVICES`),
  takes runs by their locks and records them.
- `run_groups`: one `experiment run --only RUN` process per run on one device, K at once, groups of
  runs (e.g. every method of a seed) most important first, within a deadline: for GPU time that comes
  in fixed stretches (tools/gpu/lanes.py is its command line).

Cluster jobs (`submit_runs`) may run on other nodes, where SQLite is not to be shared: each job runs
`run_experiment(only=<its run>, record=False)` (the code path of the commands `--dry-run` prints)
under the run's lock, training and scoring it in its folder; `collect_experiment` then records the
finished runs, from one process.
"""
from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from .. import devices, outputs
from ..config import yaml_safe_load
from ..errors import ConfigError, RunError
from .run import collect_experiment, run_experiment, save_spec, select, trained_info
from .spec import load_experiment
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


# -- the lane scheduler ----------------------------------------------------------------------------

@dataclass
class LaneJob:
    """One command for `run_queue`.

    `name` identifies it in the result (a run's name for `run_groups`); `group`: its priority group,
    lower first (a group starts whole or not at all, and the highest running group is the first
    stopped when a run is projected past the deadline); `env`: its environment (None: this one's);
    `log`: a file for its output (None: its lines go to stderr, each prefixed with `prefix`);
    `run_dir`: a run folder whose train_log.jsonl and run_info.json tell its steps done and in all
    (what the projection needs; None: never projected); `new_session`: start it in a process group of
    its own, so that stopping it stops its children too (and a Ctrl-C here does not reach it).
    """
    name: str
    argv: list[str]
    group: int = 0
    env: dict[str, str] | None = None
    log: Path | None = None
    prefix: str = ""
    run_dir: Path | None = None
    new_session: bool = False


def last_step(run_dir: Path | None) -> tuple[int, int | None]:
    """(the last logged step, total_steps or None) of a run folder (0, None where nothing is logged)."""
    step, total = 0, None
    if run_dir is None:
        return step, total
    log = Path(run_dir) / "train_log.jsonl"
    if log.is_file():
        lines = log.read_text(encoding="utf-8").strip().splitlines()
        if lines:
            try:
                step = json.loads(lines[-1])["step"]
            except (ValueError, KeyError):
                pass
    info = Path(run_dir) / "run_info.json"
    if info.is_file():
        try:
            total = json.loads(info.read_text(encoding="utf-8")).get("total_steps")
        except ValueError:
            pass
    return step, total


def family(run: str) -> str:
    """The data set of a run name ("n128" of "n128/mean/seed1"; "" for "baseline/seed1"): its runs
    take alike, so one that finished times the others."""
    parts = run.split("/")
    return parts[0] if len(parts) == 3 else ""


def expected_seconds(took: dict[str, float], run: str) -> float | None:
    """How long `run` should take: what a finished run of its family took (`took`, by `family`),
    else the shortest any finished run took; None while none finished."""
    return took.get(family(run), min(took.values(), default=None))


class _Lane:
    """A started `LaneJob`: its process, its measured progress (time, step) and how it ended."""

    def __init__(self, job: LaneJob):
        self.job, self.run, self.group = job, job.name, job.group
        self.started = time.time()
        self.points: list[tuple[float, int]] = []
        self.end: float | None = None
        self.outcome: str | None = None
        self.returncode: int | None = None
        self.pipe = None
        if job.log is not None:
            self.out = open(job.log, "w", encoding="utf-8")
            self.proc = subprocess.Popen(job.argv, stdout=self.out, stderr=subprocess.STDOUT, env=job.env,
                                         start_new_session=job.new_session)
        else:
            self.out = None
            self.proc = subprocess.Popen(job.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=job.env,
                                         text=True, bufsize=1, start_new_session=job.new_session)
            self.pipe = threading.Thread(target=_pipe, args=(self.proc.stdout, job.prefix, sys.stderr), daemon=True)
            self.pipe.start()

    def _ended(self, when: float, outcome: str, returncode: int | None) -> None:
        self.end, self.outcome, self.returncode = when, outcome, returncode
        if self.pipe is not None:
            self.pipe.join(timeout=5)
        if self.out is not None:
            self.out.close()

    def poll(self, now: float) -> None:
        step, _ = last_step(self.job.run_dir)
        if step and (not self.points or self.points[-1][1] != step):
            self.points.append((now, step))
        rc = self.proc.poll()
        if rc is not None and self.outcome is None:
            self._ended(now, "finished" if rc == 0 else f"failed rc={rc}", rc)

    def projected_end(self, now: float, tail: float, observe: float = 0.0) -> float | None:
        """When the run should end: the steps left at its measured rate (evaluations included, once
        the rate spans one), plus `tail` for the final scoring; None until `observe` seconds of steps."""
        _, total = last_step(self.job.run_dir)
        if total is None or len(self.points) < 2:
            return None
        (t0, s0), (t1, s1) = self.points[0], self.points[-1]
        if s1 <= s0 or t1 - t0 < max(observe, 1e-9):
            return None
        rate = (s1 - s0) / (t1 - t0)
        return now + (total - s1) / rate + tail

    def stop(self, why: str) -> None:
        if self.proc.poll() is None:
            try:
                if self.job.new_session:
                    os.killpg(self.proc.pid, signal.SIGTERM)
                else:
                    self.proc.terminate()
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                if self.job.new_session:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                else:
                    self.proc.kill()
                self.proc.wait()
        if self.outcome is None:
            self._ended(time.time(), why, self.proc.returncode)


def run_queue(jobs: Sequence[LaneJob], *, lanes: int, deadline_s: float | None = None, tail: float = 60.0,
              observe: float = 45.0, poll: float = 10.0, note: Callable[[str], None] | None = None) -> dict:
    """Run `jobs` as processes, at most `lanes` at once, within `deadline_s` seconds: posbias's one
    lane scheduler (`run_lanes` and `run_groups` are built on it).

    Jobs start in the order given, a priority group (`LaneJob.group`) at a time, whole or not at all:
    at first as many groups as fit the lanes; then, whenever lanes are free, the next group, but
    with a deadline only once a finished run says how long one takes (`expected_seconds`: one of the
    same `family`) and that still fits (with 10% to spare). With a deadline, once the running jobs'
    speed is known (`observe` seconds of logged steps, `LaneJob.run_dir`), while any is projected
    to end after it (`tail` seconds added for its final scoring) the lowest-priority group running is
    stopped, which also frees the device for the others; at the deadline everything still running is
    stopped. Without a deadline every job runs to its end. If this function is interrupted (an
    exception, Ctrl-C), every job it started is stopped before the exception goes on.

    Args:
        jobs: the commands, most important group first.
        lanes: how many run at once.
        deadline_s: seconds from now, or None for no time budget.
        tail: seconds a run needs after its last training step (its final scoring).
        observe: seconds of logged steps before a run's end is projected.
        poll: seconds between looks at the processes and their logs.
        note: called with each event line (`[lanes +SECONDSs] what`), e.g. `print`; they are also
            returned.

    Returns:
        `{"wall_s", "events", "runs": {name: {"outcome", "returncode", "seconds", "last_step",
        "total_steps"}}, "not_started": [names]}`. `runs` lists the jobs started, in the order they
        ended; an outcome is "finished", "failed rc=N", "stopped at the deadline" or "stopped:
        projected past the deadline".
    """
    t_start = time.time()
    deadline = None if deadline_s is None else t_start + deadline_s
    queue = list(jobs)
    running: list[_Lane] = []
    done: list[_Lane] = []
    events: list[str] = []

    def event(msg: str) -> None:
        line = f"[lanes +{time.time() - t_start:6.0f}s] {msg}"
        events.append(line)
        if note is not None:
            note(line)

    def group_fits() -> bool:  # the next queued group starts whole or not at all
        g = queue[0].group
        return len(running) + sum(1 for job in queue if job.group == g) <= lanes

    def start_group() -> None:
        g = queue[0].group
        while queue and queue[0].group == g:
            running.append(_Lane(queue.pop(0)))
            event(f"start {running[-1].run}")

    def time_fits(now: float) -> bool:
        if deadline is None:
            return True
        t = expected_seconds(took, queue[0].name)
        return bool(t) and now + t * 1.1 < deadline

    took: dict[str, float] = {}  # how long a finished run took, start to end, by family
    try:
        while queue and group_fits():
            start_group()
        while running:
            time.sleep(poll)
            now = time.time()
            for lane in list(running):
                lane.poll(now)
                if lane.outcome is not None:
                    running.remove(lane)
                    done.append(lane)
                    event(f"{lane.run}: {lane.outcome} after {lane.end - lane.started:.0f}s")
                    if lane.outcome == "finished":
                        f = family(lane.run)
                        took[f] = min(took.get(f, 1e9), lane.end - lane.started)
            if deadline is not None and now >= deadline:
                for lane in running:
                    lane.stop("stopped at the deadline")
                    event(f"{lane.run}: stopped at the deadline, step {last_step(lane.job.run_dir)[0]}")
                done += running
                running = []
                break
            if deadline is not None:
                # Lowest priority last: stop its group while any running run is projected past the deadline.
                ends = [(lane, lane.projected_end(now, tail, observe)) for lane in running]
                late = [lane for lane, end in ends if end is not None and end > deadline]
                if late and len({lane.group for lane in running}) > 1:
                    worst = max(lane.group for lane in running)
                    for victim in [lane for lane in running if lane.group == worst]:
                        victim.stop("stopped: projected past the deadline")
                        projected = ", ".join(f"{ln.run} ends +{end - t_start:.0f}s" for ln, end in ends if end)
                        event(f"{victim.run}: stopped at step {last_step(victim.job.run_dir)[0]}, projected past the "
                              f"deadline ({projected})")
                        running.remove(victim)
                        done.append(victim)
            # Start a queued group only when one run's measured time (of its data set, where one finished) still fits.
            while queue and group_fits() and time_fits(now):
                start_group()
    finally:
        for lane in running:  # interrupted: no job outlives this call
            lane.stop("stopped: interrupted")
    return {"wall_s": round(time.time() - t_start, 1), "events": events,
            "runs": {lane.run: {"outcome": lane.outcome, "returncode": lane.returncode,
                                "seconds": round((lane.end or time.time()) - lane.started, 1),
                                "last_step": last_step(lane.job.run_dir)[0],
                                "total_steps": last_step(lane.job.run_dir)[1]} for lane in done},
            "not_started": [job.name for job in queue]}


def run_groups(spec, groups: Sequence[Sequence[str]], *, deadline_s: float, lanes: int = 3, device: str = "cuda",
               output_dir=None, threads: int = 2, log_dir, tail: float = 60.0, observe: float = 45.0,
               poll: float = 10.0, note: Callable[[str], None] | None = print) -> dict:
    """Run a grid's runs on one device as concurrent lanes within a deadline (`run_queue`): one
    `posbias experiment run SPEC --only RUN --no-wait` process per run, at most `lanes` at once, in
    groups most important first (e.g. every method of seed 1, then of seed 2: a seed is of use for a
    comparison only when all its methods finish). Each lane records its run in the experiment's
    store like any `experiment run`.

    Args:
        spec: the experiment spec (a YAML path or a bundled spec's name), as `experiment run` takes it.
        groups: the groups of run names, most important first.
        deadline_s: seconds from now.
        lanes: how many runs at once.
        device: the runs' `--device`.
        output_dir: the experiment folder (default: the spec's).
        threads: OMP threads per lane.
        log_dir: the folder for each lane's output (`<run with / as __>.log`), created if needed.
        tail, observe, poll, note: as `run_queue` takes them.

    Returns:
        `run_queue`'s result, with `spec` and `experiment_dir` (where the runs' folders are, under
        `runs/`).
    """
    exp_dir = load_experiment(spec, output_dir).output_dir
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    jobs = []
    for gi, group in enumerate(groups):
        for run in group:
            cmd = [sys.executable, "-m", "posbias", "experiment", "run", str(spec), "--only", run, "--no-wait",
                   "--device", device, *(["--output-dir", str(output_dir)] if output_dir else [])]
            jobs.append(LaneJob(run, cmd, group=gi, env=env, log=log_dir / (run.replace("/", "__") + ".log"),
                                run_dir=exp_dir / "runs" / run, new_session=True))
    result = run_queue(jobs, lanes=lanes, deadline_s=deadline_s, tail=tail, observe=observe, poll=poll, note=note)
    return {"spec": str(spec), "experiment_dir": str(exp_dir), **result}


def run_lanes(spec, output_dir=None, *, gpus, only: list[str] | None = None, force: bool = False,
              wait: bool = True, device: str | None = None, progress: bool = True) -> dict:
    """Run a grid with one lane per GPU: a `posbias experiment run` process per entry of `gpus`
    (indices, e.g. "0,1,2,3" or a list), each with `CUDA_VISIBLE_DEVICES` set to its GPU and
    `--device cuda` (its GPU; `device` overrides, e.g. cpu), all on one store. A lane's runs are
    trained, scored and recorded in that lane. Each lane's output comes through prefixed `[gpu N]`.
    The lanes are `run_queue`'s jobs, all started at once, with no deadline.

    Returns what `run_experiment` returns, for the grid: the runs the lanes finished (`ran`),
    found finished (`skipped_finished`) and did not finish (`left_to_others`: held by processes
    outside the lanes, with `wait=False`), and each lane's exit code (`lanes`).
    """
    gpus = parse_gpus(",".join(map(str, gpus)) if isinstance(gpus, (list, tuple)) else gpus)
    if device is not None and device.startswith("cuda:"):
        raise ConfigError(f"--device {device} names one GPU: with --gpus each lane sees only its own GPU "
                          "(as cuda:0); leave --device out or use --device cuda")
    if device is None or device == "cuda":  # the lanes train on their GPUs: there must be as many
        devices.check_gpus(gpus)
    exp = select(spec, output_dir, only=only, device=device)
    outputs.claim_folder(exp.output_dir, "experiment output_dir")
    save_spec(exp, spec)
    before = _finished(exp)
    cmd = [sys.executable, "-m", "posbias", *([] if progress else ["-q"]), "experiment", "run",
           str(exp.output_dir.resolve() / "experiment.yaml"), "--output-dir", str(exp.output_dir.resolve()),
           "--device", device or "cuda", *(["--force"] if force else []), *([] if wait else ["--no-wait"]),
           *(["--only", *[glob.escape(r.name) for r in exp.runs]] if only else [])]
    jobs = [LaneJob(f"gpu {gpu}", cmd, env={**os.environ, "CUDA_VISIBLE_DEVICES": gpu}, prefix=f"[gpu {gpu}] ")
            for gpu in gpus]
    ended = run_queue(jobs, lanes=len(jobs), poll=0.2)["runs"]  # every lane at once, each to its end
    codes = {gpu: ended[f"gpu {gpu}"]["returncode"] for gpu in gpus}
    failed = [(gpu, code) for gpu, code in codes.items() if code != 0]
    if failed:
        raise RunError(f"experiment {exp.name}: the lane on GPU {failed[0][0]} exited with {failed[0][1]} "
                       f"({len(failed)} lane(s) failed; their lines above, [gpu N], say why); "
                       "run the same command again to resume")
    after = _finished(exp)
    return {"experiment": exp.name, "output_dir": str(exp.output_dir),
            "ran": [r.name for r in exp.runs if r.name in after - before],
            "skipped_finished": [r.name for r in exp.runs if r.name in before], "finished_by_others": [],
            "left_to_others": [r.name for r in exp.runs if r.name not in after],
            "lanes": codes}


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



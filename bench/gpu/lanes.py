"""Run an experiment grid on one GPU as concurrent lanes, within a deadline, and archive what finished.

GPU time comes in short, fixed stretches (issue 49): a run cut off by the end of the stretch is lost
with the machine, so this starts one `posbias experiment run --only RUN` process per run, in the
order given, at most `--lanes` at once, and watches their train_log.jsonl. Runs come in groups
(comma-separated run names: e.g. every method of seed 1), most important first, since a seed is only
of use for a comparison when all its methods finish. Once the runs' speed is known (`--observe`
seconds of logged steps), while a run is projected past the deadline the lowest-priority group
running is stopped (that also frees the GPU for the others); a queued group starts only while the
time left exceeds what one run took (one of the same data set, `n128` of `n128/mean/seed1`, once one
finished). At the deadline everything still running is stopped. Then the finished runs' records are
archived with `posbias experiment copy` (the store, no checkpoints) into `--archive`, with each run's
small files (run_info.json, config, logs, position updates, eval metrics) beside them.

    python bench/gpu/lanes.py bench/gpu/rp_full.yaml --deadline 420 --lanes 6 --archive /tmp/a \
        --runs baseline/seed1,random_padding/seed1 baseline/seed2,random_padding/seed2
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from posbias.experiment import load_experiment

SMALL = ("run_info.json", "config.yaml", "run_config.yaml", "train_log.jsonl", "eval_log.jsonl",
         "position_updates.json", "stats.json")


def last_step(run_dir: Path) -> tuple[int, int | None]:
    """(the last logged step, total_steps or None) of a run folder."""
    step, total = 0, None
    log = run_dir / "train_log.jsonl"
    if log.is_file():
        lines = log.read_text(encoding="utf-8").strip().splitlines()
        if lines:
            try:
                step = json.loads(lines[-1])["step"]
            except (ValueError, KeyError):
                pass
    info = run_dir / "run_info.json"
    if info.is_file():
        try:
            total = json.loads(info.read_text(encoding="utf-8")).get("total_steps")
        except ValueError:
            pass
    return step, total


def family(run: str) -> str:
    """The data set of a run name ("n128" of "n128/mean/seed1"; "" for "baseline/seed1"): its runs take alike."""
    parts = run.split("/")
    return parts[0] if len(parts) == 3 else ""


def expected_seconds(took: dict[str, float], run: str) -> float | None:
    """How long `run` should take: what a finished run of its family took (`took`, by family), else the
    shortest any finished run took; None while none finished."""
    return took.get(family(run), min(took.values(), default=None))


class Lane:
    def __init__(self, run: str, group: int, argv: list[str], log: Path, run_dir: Path, env: dict):
        self.run, self.group, self.run_dir, self.log = run, group, run_dir, log
        self.started = time.time()
        self.points: list[tuple[float, int]] = []
        self.f = open(log, "w", encoding="utf-8")
        self.proc = subprocess.Popen(argv, stdout=self.f, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        self.end: float | None = None
        self.outcome: str | None = None

    def poll(self, now: float) -> None:
        step, _ = last_step(self.run_dir)
        if step and (not self.points or self.points[-1][1] != step):
            self.points.append((now, step))
        rc = self.proc.poll()
        if rc is not None and self.outcome is None:
            self.end, self.outcome = now, ("finished" if rc == 0 else f"failed rc={rc}")
            self.f.close()

    def projected_end(self, now: float, tail: float, observe: float = 0.0) -> float | None:
        """When the run should end: the steps left at its measured rate (evaluations included, once
        the rate spans one), plus `tail` for the final scoring."""
        _, total = last_step(self.run_dir)
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
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.outcome is None:
            self.end, self.outcome = time.time(), why
            self.f.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec")
    ap.add_argument("--runs", nargs="+", required=True,
                    help="groups of comma-separated run names, most important first")
    ap.add_argument("--deadline", type=float, required=True, help="seconds from now")
    ap.add_argument("--lanes", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tail", type=float, default=60.0, help="seconds a run needs after its last step")
    ap.add_argument("--archive", required=True, help="folder for the archived store and run files")
    ap.add_argument("--output-dir", default=None, help="the experiment folder (default: the spec's)")
    ap.add_argument("--threads", type=int, default=2, help="OMP threads per lane")
    ap.add_argument("--poll", type=float, default=10.0)
    ap.add_argument("--observe", type=float, default=45.0, help="seconds of logged steps before a projection")
    args = ap.parse_args(argv)

    t_start = time.time()
    deadline = t_start + args.deadline
    exp_dir = load_experiment(args.spec, args.output_dir).output_dir  # a YAML path or a bundled spec's name
    archive = Path(args.archive)
    (archive / "lanes").mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    groups = [[r for r in g.split(",") if r] for g in args.runs]
    queue = [(gi, r) for gi, g in enumerate(groups) for r in g]
    lanes, done = [], []
    events = []

    def note(msg: str) -> None:
        line = f"[lanes +{time.time() - t_start:6.0f}s] {msg}"
        events.append(line)
        print(line, flush=True)

    def start(group: int, run: str) -> None:
        cmd = [sys.executable, "-m", "posbias", "experiment", "run", args.spec, "--only", run, "--no-wait",
               "--device", args.device]
        if args.output_dir:
            cmd += ["--output-dir", args.output_dir]
        log = archive / "lanes" / (run.replace("/", "__") + ".log")
        lanes.append(Lane(run, group, cmd, log, exp_dir / "runs" / run, env))
        note(f"start {run}")

    def group_fits() -> bool:  # the next queued group starts whole or not at all
        g = queue[0][0]
        return len(lanes) + sum(1 for gi, _ in queue if gi == g) <= args.lanes

    while queue and group_fits():
        g = queue[0][0]
        while queue and queue[0][0] == g:
            start(*queue.pop(0))
    took: dict[str, float] = {}  # how long a finished run took, start to end, by family (family())
    while lanes:
        time.sleep(args.poll)
        now = time.time()
        for lane in list(lanes):
            lane.poll(now)
            if lane.outcome is not None:
                lanes.remove(lane)
                done.append(lane)
                note(f"{lane.run}: {lane.outcome} after {lane.end - lane.started:.0f}s")
                if lane.outcome == "finished":
                    f = family(lane.run)
                    took[f] = min(took.get(f, 1e9), lane.end - lane.started)
        if now >= deadline:
            for lane in lanes:
                lane.stop("stopped at the deadline")
                note(f"{lane.run}: stopped at the deadline, step {last_step(lane.run_dir)[0]}")
            done += lanes
            lanes = []
            break
        # Lowest priority last: stop its group while any running run is projected past the deadline.
        ends = [(lane, lane.projected_end(now, args.tail, args.observe)) for lane in lanes]
        late = [lane for lane, end in ends if end is not None and end > deadline]
        if late and len({lane.group for lane in lanes}) > 1:
            worst = max(lane.group for lane in lanes)
            for victim in [lane for lane in lanes if lane.group == worst]:
                victim.stop("stopped: projected past the deadline")
                note(f"{victim.run}: stopped at step {last_step(victim.run_dir)[0]}, projected past the deadline "
                     f"({', '.join(f'{lane.run} ends +{end - t_start:.0f}s' for lane, end in ends if end)})")
                lanes.remove(victim)
                done.append(victim)
        # Start a queued group only when one run's measured time (of its data set, where one finished) still fits.
        while queue and group_fits() and (t := expected_seconds(took, queue[0][1])) and now + t * 1.1 < deadline:
            g = queue[0][0]
            while queue and queue[0][0] == g:
                start(*queue.pop(0))

    # ---- archive: the finished runs' records (no checkpoints), their small files, the lane logs
    status = {"spec": args.spec, "experiment_dir": str(exp_dir), "deadline_s": args.deadline,
              "lanes": args.lanes, "wall_s": round(time.time() - t_start, 1), "events": events,
              "runs": {lane.run: {"outcome": lane.outcome, "seconds": round((lane.end or time.time()) - lane.started, 1),
                                  "last_step": last_step(lane.run_dir)[0], "total_steps": last_step(lane.run_dir)[1]}
                       for lane in done},
              "not_started": [r for _, r in queue]}
    if (exp_dir / "experiment.sqlite").is_file():
        r = subprocess.run([sys.executable, "-m", "posbias", "experiment", "copy", str(exp_dir), str(archive / "store")],
                           capture_output=True, text=True, env=env)
        status["copy"] = {"returncode": r.returncode, "stdout": r.stdout[-2000:], "stderr": r.stderr[-2000:]}
    for lane in done:
        dest = archive / "runs" / lane.run
        dest.mkdir(parents=True, exist_ok=True)
        for name in SMALL:
            if (lane.run_dir / name).is_file():
                shutil.copy2(lane.run_dir / name, dest / name)
        for metrics in lane.run_dir.glob("evals/*/metrics.json"):
            (dest / "evals" / metrics.parent.name).mkdir(parents=True, exist_ok=True)
            shutil.copy2(metrics, dest / "evals" / metrics.parent.name / "metrics.json")
        if (lane.run_dir / "best" / "metrics.json").is_file():
            shutil.copy2(lane.run_dir / "best" / "metrics.json", dest / "best_metrics.json")
    (archive / "lanes.json").write_text(json.dumps(status, indent=2), encoding="utf-8")
    print(json.dumps({k: status[k] for k in ("wall_s", "runs", "not_started")}, indent=1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Run an experiment grid on one GPU as concurrent lanes, within a deadline, and archive what finished.

The command line of `posbias.experiment.cluster.run_groups` (the scheduling, on posbias's one lane
scheduler `run_queue`), plus the archive step for a machine that goes away.

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

    python tools/gpu/lanes.py reproductions/random_padding/rp_full.yaml --deadline 420 --lanes 6 \
        --archive /tmp/a --runs baseline/seed1,random_padding/seed1 baseline/seed2,random_padding/seed2
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from posbias.experiment.cluster import run_groups
# The scheduler's timing rule, as tests/tools/test_gpu_scripts.py checks it through this script:
from posbias.experiment.cluster import expected_seconds, family  # noqa: F401

SMALL = ("run_info.json", "config.yaml", "run_config.yaml", "train_log.jsonl", "eval_log.jsonl",
         "position_updates.json", "stats.json")


def archive_runs(status: dict, archive: Path) -> None:
    """The finished runs' records (`posbias experiment copy`: the store, no checkpoints) into
    `archive/store`, each started run's small files into `archive/runs/<run>`, and lanes.json."""
    exp_dir = Path(status["experiment_dir"])
    if (exp_dir / "experiment.sqlite").is_file():
        r = subprocess.run([sys.executable, "-m", "posbias", "experiment", "copy", str(exp_dir),
                            str(archive / "store")], capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        status["copy"] = {"returncode": r.returncode, "stdout": r.stdout[-2000:], "stderr": r.stderr[-2000:]}
    for run in status["runs"]:
        run_dir, dest = exp_dir / "runs" / run, archive / "runs" / run
        dest.mkdir(parents=True, exist_ok=True)
        for name in SMALL:
            if (run_dir / name).is_file():
                shutil.copy2(run_dir / name, dest / name)
        for metrics in run_dir.glob("evals/*/metrics.json"):
            (dest / "evals" / metrics.parent.name).mkdir(parents=True, exist_ok=True)
            shutil.copy2(metrics, dest / "evals" / metrics.parent.name / "metrics.json")
        if (run_dir / "best" / "metrics.json").is_file():
            shutil.copy2(run_dir / "best" / "metrics.json", dest / "best_metrics.json")
    (archive / "lanes.json").write_text(json.dumps(status, indent=2), encoding="utf-8")


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

    archive = Path(args.archive)
    groups = [[r for r in g.split(",") if r] for g in args.runs]
    status = run_groups(args.spec, groups, deadline_s=args.deadline, lanes=args.lanes, device=args.device,
                        output_dir=args.output_dir, threads=args.threads, log_dir=archive / "lanes", tail=args.tail,
                        observe=args.observe, poll=args.poll, note=lambda line: print(line, flush=True))
    status = {"spec": args.spec, "experiment_dir": status["experiment_dir"], "deadline_s": args.deadline,
              "lanes": args.lanes, **{k: status[k] for k in ("wall_s", "events", "runs", "not_started")}}
    archive_runs(status, archive)
    print(json.dumps({k: status[k] for k in ("wall_s", "runs", "not_started")}, indent=1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Experiments: a grid of runs (dataset x train size x method x seed), a resumable SQLite store.

Every run is an ordinary `posbias.train` (+ `posbias.evaluate` on each eval set) in its own folder;
for a given seed every method sees the same batches (the order depends on the seed and the data
only). Results go to `<output_dir>/experiment.sqlite`, one transaction per finished run.

One concern per module, in the order a grid meets them:
- `spec`: the experiment spec (YAML or a mapping; its keys are listed there) expanded into its runs;
- `store`: the SQLite store (schema, opening, damage checks) and the runs' OS locks, by which any
  number of processes share one grid ("Sharing a store");
- `run`: `run_experiment`, which trains, evaluates and records every unfinished run, locally or
  through `accelerate launch`; `collect_experiment`, which records the runs cluster jobs trained and
  lists the unfinished ones, never training;
- `cluster`: the lane scheduler `run_queue` (commands as processes, K at once, in priority groups,
  within a time budget) and what runs on it: `run_lanes` (one `experiment run` process per GPU of
  one machine, on one store) and `run_groups` (one process per run on one device, within a
  deadline); and `submit_runs` (a Slurm job per unfinished run through submitit:
  `pip install posbias[cluster]`);
- `collect`: a trained run's folder read into the store's rows (metrics, per-example scores,
  segments, curves);
- `archive`: `copy_results`, finished runs' results (not checkpoints) copied between folders, to
  archive a grid, restore it, or join the stores of several machines;
- `aggregation`: the store read back (`load_results`) and aggregated over seeds, with paired t-tests
  and bootstraps against the baseline;
- `report`: `write_report`, the report (report.md/.html/.json, plots) of an experiment folder. It sits
  above the others and the shared rendering of `posbias.analysis.report`, and is not imported here:
  it loads the tasks, and torch with them, at its top; the other modules import them inside the
  functions that need them, so `import posbias.experiment` stays light.
"""
from __future__ import annotations

from ..registry import SEGMENTERS
from .aggregation import (METRIC_KEYS, aggregate, aggregate_segments, gold_segment_labels, load_results,
                          metric_value, report_metrics)
from .archive import copy_results
from .cluster import LaneJob, parse_gpus, run_groups, run_lanes, run_queue, submit_runs
from .collect import collect_results, position_update_curve, score_run
from .run import collect_experiment, execute_run, plan, run_experiment
from .spec import POSITION_EVAL_OPTIONS, SPEC_KEYS, Experiment, Run, load_experiment, run_name
from .store import (SCHEMA, STORE_WAY_OUT, check_store, claim, connect, grid_running, holder, lock_path,
                    open_for_reading, readable_store, release, run_status)

__all__ = ["METRIC_KEYS", "POSITION_EVAL_OPTIONS", "SCHEMA", "SEGMENTERS", "SPEC_KEYS", "STORE_WAY_OUT", "Experiment",
           "LaneJob", "Run", "aggregate", "aggregate_segments", "check_store", "claim", "collect_experiment",
           "collect_results", "connect",
           "copy_results", "execute_run", "gold_segment_labels", "grid_running", "holder", "load_experiment",
           "load_results", "lock_path", "metric_value", "open_for_reading", "parse_gpus", "plan",
           "position_update_curve", "readable_store", "release", "report_metrics", "run_experiment", "run_groups",
           "run_lanes", "run_name", "run_queue", "run_status", "score_run", "submit_runs"]

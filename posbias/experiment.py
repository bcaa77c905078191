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
    output_dir: runs/experiments/smoke

Every run is an ordinary `posbias.train` (+ `posbias.evaluate` on each eval set) in its own folder;
for a given seed every method sees the same batches (the order depends on the seed and the data
only). Results go to `<output_dir>/experiment.sqlite`, one transaction per finished run.
"""
from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .config import RunConfig, build_config, deep_merge, load_yaml, parse_overrides
from .errors import ConfigError
from .registry import Registry

# Per-question segmenters: name -> function(examples, nbest, features_info) -> {qid: segment label}.
# Position analyses (answer-position quartiles, S_X^(1)/S_X^(2)) register here.
SEGMENTERS = Registry("segmenter")

SPEC_KEYS = {"name", "base", "overrides", "methods", "seeds", "datasets", "train_sizes", "eval_sets",
             "output_dir", "baseline", "segments", "description"}


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
    segments: list[str] = field(default_factory=list)
    spec_path: str | None = None

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


def load_experiment(spec, output_dir: str | None = None) -> Experiment:
    """Expand a spec (path or mapping) into its runs, each with a validated config."""
    from .api import preset_path

    base_dir = Path.cwd()
    spec_path = None
    if not isinstance(spec, dict):
        spec_path = str(spec)
        base_dir = Path(spec).resolve().parent
        spec = load_yaml(spec)
    unknown = sorted(set(spec) - SPEC_KEYS)
    if unknown:
        raise ConfigError(f"experiment spec: unknown key {unknown[0]!r}; known keys: {sorted(SPEC_KEYS)}")
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

    datasets = spec.get("datasets") or {None: {}}
    sizes = spec.get("train_sizes") or [None]
    runs = []
    for ds_name, ds_over in datasets.items():
        for size in sizes:
            for method, m_over in methods.items():
                for seed in seeds:
                    parts = [p for p in (ds_name, f"n{size}" if size else None, method, f"seed{seed}") if p]
                    name = "/".join(parts)
                    d = deep_merge(base, _as_overrides(ds_over, f"datasets.{ds_name}"))
                    d = deep_merge(d, _as_overrides(m_over, f"methods.{method}"))
                    run_dir = out / "runs" / name
                    extra = {"train": {"seed": seed, "output_dir": str(run_dir)}}
                    if size:
                        extra["data"] = {"max_train_examples": size}
                    try:
                        cfg = build_config(deep_merge(d, extra))
                    except ConfigError as e:
                        raise ConfigError(f"experiment run {name}: {e}") from None
                    runs.append(Run(name, method, seed, ds_name, size, cfg, run_dir))
    eval_sets = spec.get("eval_sets") or {}
    if not isinstance(eval_sets, dict):
        raise ConfigError("experiment spec: eval_sets must be a mapping name -> file")
    segments = spec.get("segments") or []
    for s in segments:
        SEGMENTERS.get(s, "segments")
    return Experiment(spec["name"], out, runs, baseline, list(methods), dict(eval_sets), list(segments),
                      spec_path)


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
CREATE TABLE IF NOT EXISTS question_scores (
    run TEXT, eval_set TEXT, qid TEXT, exact REAL, f1 REAL, PRIMARY KEY (run, eval_set, qid)
);
CREATE TABLE IF NOT EXISTS curves (
    run TEXT, kind TEXT, step INTEGER, value REAL, PRIMARY KEY (run, kind, step)
);
"""


def connect(db_path) -> sqlite3.Connection:
    Path(db_path).parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(str(db_path), timeout=60)
    conn.execute("PRAGMA journal_mode=WAL")  # readers (report) never block a writing run
    conn.executescript(SCHEMA)
    return conn


def run_status(conn, name: str) -> tuple[str | None, str | None]:
    row = conn.execute("SELECT status, config_hash FROM runs WHERE name = ?", (name,)).fetchone()
    return (row[0], row[1]) if row else (None, None)

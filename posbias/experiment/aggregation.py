"""An experiment's store read back (`load_results`) and aggregated for its report: per dataset x
train size x eval set x method, each metric's mean ± std over seeds and its difference to the
baseline (paired t-test over seeds with its t-interval and Holm-adjusted p-value, paired bootstrap
over examples), and the same per segment.
"""
from __future__ import annotations

import json
import math
import sqlite3
from contextlib import closing
from fnmatch import fnmatchcase
from pathlib import Path

import numpy as np

from ..analysis.stats import holm, mean_std, paired_bootstrap, paired_bootstrap_ratio, paired_ttest
from .. import compat
from ..config import DEFAULT_TASK, build_config, load_yaml
from ..errors import ConfigError
from ..registry import SEGMENTERS
from .spec import _segment_spec
from .store import check_store, open_for_reading, readable_store


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
        tables = {t for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        copies = ([dict(r) for r in conn.execute("SELECT run, eval_set, data FROM copy_scores")]
                  if "copy_scores" in tables else [])
    for r in runs:
        r["metrics"] = _stored_metrics(r, db)
        _check_config(r, db)
    if only:
        runs = [r for r in runs if any(fnmatchcase(r["name"], p) for p in only)]
        if not runs:
            raise ConfigError(f"--only {' '.join(only)} matches none of the runs in {db}")
        kept = {r["name"] for r in runs}
        segments, curves, questions, copies = ([row for row in rows if row["run"] in kept]
                                               for rows in (segments, curves, questions, copies))
    present = {r["method"] for r in runs}
    methods = [m for m in (spec.get("methods") or {}) if m in present] or sorted(present)
    if baseline is None:
        baseline = spec.get("baseline", next(iter(spec.get("methods") or {}), methods[0] if methods else None))
    elif baseline not in present:
        raise ConfigError(f"--baseline {baseline}: no runs of that method in {db}"
                          + (f" matching --only {' '.join(only)}" if only else "") + f" (methods: {', '.join(methods)})")
    return {"name": spec.get("name", Path(exp_dir).name), "spec": spec, "runs": runs, "segments": segments,
            "curves": curves, "questions": questions, "copies": copies, "methods": methods, "baseline": baseline}


def _check_config(run: dict, db: Path) -> None:
    """A run's `config_json` must be a JSON object (the report and the analyses read its task and data keys):
    else one line naming the store and the run."""
    try:
        config = json.loads(run["config_json"]) if run["config_json"] else {}
    except (ValueError, RecursionError, TypeError) as e:
        why = " ".join(str(e).split())[:200] or type(e).__name__
        raise ConfigError(f"{db}: run {run['name']!r}: its config_json is not valid JSON ({why}); the store was "
                          "edited or damaged") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{db}: run {run['name']!r}: its config_json is not a JSON object; the store was edited "
                          "or damaged")


def _stored_metrics(run: dict, db: Path) -> dict:
    """A run's `metrics_json` read back; one that is not a JSON object is an error naming the store and
    the run (the store was edited or damaged)."""
    if not run["metrics_json"]:
        return {}
    try:
        metrics = json.loads(run["metrics_json"])
    except (ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
        why = " ".join(str(e).split())[:200] or type(e).__name__
        raise ConfigError(f"{db}: run {run['name']!r}: its metrics_json is not valid JSON ({why}); the store "
                          "was edited or damaged") from None
    if not isinstance(metrics, dict):
        raise ConfigError(f"{db}: run {run['name']!r}: its metrics_json is not a JSON object; the store was "
                          "edited or damaged")
    if bad := non_finite(metrics):
        raise ConfigError(f"{db}: run {run['name']!r}: its metrics_json holds {bad[1]} at {bad[0]}; a metric is a "
                          "finite number, and a mean or t-test over this one would print it as a finding")
    return metrics


def non_finite(metrics) -> tuple[str, float] | None:
    """(key path, value) of the first NaN or inf in parsed JSON, or None. Python's json writes and
    reads them as NaN / Infinity (and reads 1e999 as inf), so a store can hold them."""
    stack = [("", metrics)]
    while stack:
        key, x = stack.pop()
        if isinstance(x, dict):
            stack.extend((f"{key}.{k}" if key else str(k), v) for k, v in x.items())
        elif isinstance(x, list):
            stack.extend((f"{key}[{i}]", v) for i, v in enumerate(x))
        elif isinstance(x, float) and not math.isfinite(x):
            return key, x
    return None


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
    EM + F1 (both, per question); NER F1, precision, recall; POS accuracy, macro F1; tagging also the
    authors' sub-token F1 where the result has it (NER results before it existed lack it); a position
    evaluation its `report` list (no per-example scores: t-test over seeds only)."""
    if "report" in metrics:
        return [name for name, _ in metrics["report"]], "none"
    if "exact_match" in metrics or "exact" in metrics:
        return ["EM", "F1"], "per-question"
    sub = ["sub-token F1"] if "f1_seqeval_subtoken" in metrics else []
    if metrics.get("scheme") == "none":  # POS
        return ["accuracy", "macro F1"] + sub, "accuracy"
    return ["F1", "precision", "recall"] + sub, "F1"


def aggregate(results: dict, bootstrap_samples: int = 10_000) -> list[dict]:
    """Per dataset x train size x eval set x method x metric: mean ± std over seeds, and the
    difference to the baseline with a paired t-test over seeds and a paired bootstrap over examples:
    QA questions (EM and F1: means of per-question scores), tagging sentences (the main metric, a
    corpus-level ratio recomputed on each resample)."""
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
    return adjust_family(rows)


def adjust_family(rows: list[dict]) -> list[dict]:
    """Holm-adjusted t-test p-values (`p_holm`) over every comparison of one table (all its data sets,
    eval sets, metrics and methods): a report that tests ~20 differences at 0.05 finds one by chance
    alone. The rows are returned, each comparison's `ttest` given `p_holm` and `family` (its size)."""
    tests = [r["ttest"] for r in rows if "ttest" in r]
    for t, adjusted in zip(tests, holm([t["p"] for t in tests])):
        t["p_holm"], t["family"] = adjusted, sum(x["p"] == x["p"] for x in tests)  # x == x: not NaN
    return rows


def _run_of_seed(runs: list[dict], seed: int) -> str | None:
    return next((r["name"] for r in runs if r["seed"] == seed), None)


def _eval_examples(results: dict, run: dict, eval_set: str):
    """The examples a run was scored on for `eval_set` (the validation set capped as in training)."""
    from ..tasks import get_task  # loads the task packages, and torch: on first use

    cfg = json.loads(run["config_json"])
    spec = cfg["data"]["eval_file"] if eval_set == "val" else (results["spec"].get("eval_sets") or {}).get(eval_set)
    if spec is None:
        return None
    ds = get_task(cfg.get("task", DEFAULT_TASK)).read(spec, build_config(cfg, saved=True))
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
        # The recorded config as today's keys (`data.stride` was `data.doc_stride` before version 2).
        cfg = json.loads(run["config_json"])
        cfg = compat.migrate(cfg, task=cfg.get("task", DEFAULT_TASK), saved=True)
        d = cfg["data"]
        setting = json.dumps([cfg["model"]["name_or_path"], cfg["model"].get("tokenizer"), d["max_seq_len"],
                              d["stride"], d["max_query_len"], d.get("context_first")])
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
    return adjust_family(rows)


def _segment_bootstrap(key, method, by_method, base, labels, per_q, samples):
    """Paired bootstrap of F1 over the questions of one gold-only segment (scores averaged over seeds)."""
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

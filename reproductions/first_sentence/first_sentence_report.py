"""Summary of the position-bias stress benchmark (issue 31; Ko et al., EMNLP 2020, "Look at the First
Sentence"), read from a finished or partly finished `reproductions/first_sentence/first_sentence_stress.yaml` folder.

Three reference points: `random/baseline` (trained on a random sample: the ceiling), `first/baseline`
(trained on first-sentence answers only: the floor), and every other arm trained on `first`. Per arm,
over its finished seeds:

* F1 on all dev questions and on those answered in sentence 2 or later ("2+"), mean ± std over seeds,
  and by answer sentence 1, 2, 3, 4, 5+ (a second table);
* Δ F1 vs first/baseline, paired by seed number, with the paired t-test p over seeds;
* share of the gap closed = (F1_arm − F1_floor) / (F1_ceiling − F1_floor), with a 95% percentile
  bootstrap over dev questions: one resample of questions for all three systems (paired), each
  system's F1 the mean over its seeds of its per-question F1 on the resampled questions. Resamples
  whose ceiling does not beat the floor (no gap to close) are dropped and counted. Beside it, what the
  seeds support: the gap closed per seed number (arm, floor and ceiling runs of the same seed), its
  mean and 95% t-interval over those seeds;
* the Δ p-values Holm-adjusted over the table's tests (every arm's Δ F1 and Δ F1 2+);
* PSI = 1 − min/max and drop = max − min of the bucket F1s (per run, then mean ± std over seeds);
* training cost: median train_seconds and wall_seconds per run, and the ratio to first/baseline's;
* loss flatness: final training loss = mean of the last 10 logged `loss` points; the relative change
  of the mean loss over the last 100 steps against the 100 steps before them (flat: |change| < 10%);
* a third table for "how does an arm train" (issue 29's question why Random Padding hurts): the mean
  training loss per block of 200 steps (about one epoch of the 3,000-question set) and the positions
  trained: for the id ranges 0-127, 128-255 and 256-511, the mean over the range's ids of the % of
  optimizer steps in which the id got a gradient (the store's `position_updates` curves).

Everything per question comes from the store's `question_scores` of the main evaluation (eval set
`val`: the runs' `data.eval_file`); the sentence buckets from the dev file (`posbias.qa.answer_sentence`,
sentencex), as the experiment's `answer_sentence` segments are.

Usage:
    python reproductions/first_sentence/first_sentence_report.py --store runs/experiments/first_sentence_stress \
        [--dev bench/out/ks_data/dev2000/dev.json] [--samples 2000] [--out FILE.md] [--json FILE.json]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from fnmatch import fnmatchcase
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from posbias.analysis.bias import drop, psi  # noqa: E402
from posbias.analysis.stats import holm, mean_std, paired_ttest, t_interval  # noqa: E402
from posbias.errors import ConfigError  # noqa: E402
from posbias.experiment import load_results, run_name  # noqa: E402
from posbias.qa.answer_sentence import answer_sentence_labels  # noqa: E402
from posbias.qa.sentences import DEFAULT_LAST, NO_ANSWER, sentence_label  # noqa: E402

EVAL_SET = "val"
"""`collect_results` stores the scores of the runs' own `data.eval_file` under this name."""
CEILING = "random/baseline"
FLOOR = "first/baseline"
ARM_DATASET = "first"
BUCKETS = [sentence_label(i) for i in range(1, DEFAULT_LAST + 1)]  # "1" .. "4", "5+"
LATER = BUCKETS[1:]  # "2+": answers in the second sentence or later
FINAL_POINTS = 10
WINDOW = 100
FLAT = 0.10
BLOCK = 200
ID_RANGES = ((0, 127), (128, 255), (256, 511))
LEVEL = 0.95


# ------------------------------------------------------------------------------- pure statistics
def gap_closed(arm, floor, ceiling):
    """Share of the floor-to-ceiling gap an arm closes: (arm − floor) / (ceiling − floor).

    Works on floats or NumPy arrays (bootstrap resamples); NaN where the ceiling does not beat the
    floor (there is no gap to close).
    """
    arm, floor, ceiling = (np.asarray(x, dtype=np.float64) for x in (arm, floor, ceiling))
    gap = ceiling - floor
    out = np.divide(arm - floor, gap, out=np.full(np.broadcast(arm, gap).shape, np.nan), where=gap > 0)
    return float(out) if out.ndim == 0 else out


def gap_over_seeds(arm: dict[int, float], floor: dict[int, float], ceiling: dict[int, float],
                   level: float = LEVEL) -> dict:
    """The gap closed per seed (arm, floor and ceiling F1 of the same seed number), and its mean and
    t-interval over those seeds: {"n", "values" (seed -> share), "mean", "ci_low", "ci_high"}. Seeds
    without a gap (ceiling <= floor) are left out."""
    seeds = sorted(set(arm) & set(floor) & set(ceiling))
    values = {s: gap_closed(arm[s], floor[s], ceiling[s]) for s in seeds}
    values = {s: v for s, v in values.items() if not math.isnan(v)}
    x = list(values.values())
    return {"n": len(x), "values": values, "mean": float(np.mean(x)) if x else math.nan, **t_interval(x, level)}


def gap_bootstrap(arm: np.ndarray, floor: np.ndarray, ceiling: np.ndarray, *, samples: int, seed: int,
                  level: float = LEVEL) -> dict:
    """Point value and percentile interval of `gap_closed` over questions resampled with replacement.

    Args:
        arm, floor, ceiling: (q,) per-question F1 of each system on the same questions (each the mean
            over that system's seeds). One index draw serves all three: the comparison is paired.
    Returns {"n", "value", "ci_low", "ci_high", "samples", "dropped"}; "dropped" counts resamples with
    no gap (ceiling <= floor), left out of the interval.
    """
    a, f, c = (np.asarray(x, dtype=np.float64) for x in (arm, floor, ceiling))
    n = len(a)
    out = {"n": n, "value": gap_closed(a.mean(), f.mean(), c.mean()) if n else math.nan,
           "ci_low": math.nan, "ci_high": math.nan, "samples": int(samples), "dropped": 0}
    if n == 0 or samples <= 0:
        return out
    rng = np.random.default_rng(seed)
    gaps = np.empty(samples)
    for lo in range(0, samples, 500):  # chunks bound memory at 500 x q indices
        idx = rng.integers(0, n, size=(min(500, samples - lo), n))
        gaps[lo:lo + len(idx)] = gap_closed(a[idx].mean(axis=1), f[idx].mean(axis=1), c[idx].mean(axis=1))
    kept = gaps[~np.isnan(gaps)]
    out["dropped"] = int(samples - len(kept))
    if len(kept):
        q = [100 * (1 - level) / 2, 100 * (1 + level) / 2]
        out["ci_low"], out["ci_high"] = (float(x) for x in np.percentile(kept, q))
    return out


def loss_flatness(points: list[tuple[int, float]], *, final_points: int = FINAL_POINTS, window: int = WINDOW) -> dict:
    """Final loss (mean of the last `final_points` logged values) and the relative change of the mean
    loss over the last `window` steps against the `window` steps before them (None without both)."""
    points = sorted(points)
    if not points:
        return {"final": None, "change": None}
    last_step = points[-1][0]
    final = float(np.mean([v for _, v in points[-final_points:]]))
    recent = [v for s, v in points if s > last_step - window]
    before = [v for s, v in points if last_step - 2 * window < s <= last_step - window]
    if not recent or not before or np.mean(before) == 0:
        return {"final": final, "change": None}
    return {"final": final, "change": float(np.mean(recent) / np.mean(before) - 1)}


def loss_blocks(points: list[tuple[int, float]], *, block: int = BLOCK) -> list[float]:
    """Mean logged loss per block of `block` steps: (0, block], (block, 2 block], ... up to the last step."""
    points = sorted(points)
    if not points:
        return []
    n = math.ceil(points[-1][0] / block)
    return [float(np.mean(v)) if (v := [x for s, x in points if k * block < s <= (k + 1) * block]) else math.nan
            for k in range(n)]


def id_range_updates(fractions: dict[int, float], ranges=ID_RANGES) -> dict[str, float]:
    """'lo-hi' -> mean over the ids lo..hi of the % of steps with a gradient (ids absent count 0)."""
    return {f"{lo}-{hi}": 100 * float(np.mean([fractions.get(i, 0.0) for i in range(lo, hi + 1)]))
            for lo, hi in ranges}


def run_stats(scores: dict[str, float], labels: dict[str, str]) -> dict:
    """One run's F1 in points (0..1 per-question scores x 100): overall, 2+, per bucket, PSI, drop."""
    qids = [q for q in scores if q in labels]

    def f1(qs):
        return 100 * float(np.mean([scores[q] for q in qs])) if qs else math.nan

    by = {b: f1([q for q in qids if labels[q] == b]) for b in BUCKETS}
    present = [v for v in by.values() if not math.isnan(v)]
    return {"f1": f1(qids), "f1_later": f1([q for q in qids if labels[q] in LATER]), "by_bucket": by,
            "psi": psi(present) if len(present) >= 2 else math.nan,
            "drop": drop(present) if len(present) >= 2 else math.nan}


# ------------------------------------------------------------------------------------ the store
def spec_eval_set(results: dict) -> tuple[str, str] | None:
    """(name, path) of the spec's one `eval_sets` entry, for a spec without `data.eval_file` whose runs
    are scored on that set alone (reproductions/first_sentence/ko_full.yaml); None otherwise."""
    sets = results["spec"].get("eval_sets")
    if isinstance(sets, dict) and len(sets) == 1:
        name, path = next(iter(sets.items()))
        return str(name), str(path)
    return None


def run_eval_file(results: dict) -> str | None:
    """The `data.eval_file` of the first finished run that has a config (None: none has one)."""
    return next((json.loads(r["config_json"])["data"].get("eval_file") for r in results["runs"]
                 if r["status"] == "finished" and r.get("config_json")), None)


def dev_path(store: Path, results: dict, dev: str | None) -> str:
    """--dev, else the spec's `overrides.data.eval_file`, else a finished run's `data.eval_file`, else the
    spec's one `eval_sets` entry; relative paths from the repository root (where `posbias experiment run`
    was started)."""
    if dev is None:
        overrides = results["spec"].get("overrides")
        dev = ((overrides or {}).get("data") or {}).get("eval_file") if isinstance(overrides, dict) else None
    if dev is None:
        dev = run_eval_file(results)
    if dev is None and spec_eval_set(results):
        dev = spec_eval_set(results)[1]
    if dev is None:
        raise ConfigError(f"{store}: no data.eval_file in experiment.yaml or the runs' configs; pass --dev")
    p = Path(dev)
    return str(p if p.is_absolute() or not (ROOT / p).exists() else ROOT / p)


def read_labels(path: str) -> dict[str, str]:
    """Question id -> answer-sentence bucket ("1" .. "5+", or "no answer")."""
    from posbias.qa.readers import read_dataset

    return answer_sentence_labels(read_dataset(path).examples)


def expected_arms(results: dict) -> dict[str, list[int]]:
    """'dataset/method' -> the seeds the spec asks for (its grid less `exclude`); without a spec, the
    arms and seeds found in the store."""
    spec = results["spec"]
    if spec.get("methods") and spec.get("seeds"):
        out = {}
        for ds in spec.get("datasets") or {None: {}}:
            for method in spec["methods"]:
                seeds = [s for s in spec["seeds"]
                         if not any(fnmatchcase(run_name(ds, None, method, s), p) for p in spec.get("exclude") or [])]
                if seeds:
                    out[f"{ds}/{method}"] = seeds
        return out
    out = {}
    for r in results["runs"]:
        out.setdefault(f"{r['dataset']}/{r['method']}", set()).add(r["seed"])
    return {k: sorted(v) for k, v in out.items()}


def arm_order(arms) -> list[str]:
    """random/baseline, first/baseline, then the other first/* arms in the order given."""
    others = [a for a in arms if a.startswith(f"{ARM_DATASET}/") and a not in (CEILING, FLOOR)]
    return [a for a in (CEILING, FLOOR) if a in arms] + others


# ------------------------------------------------------------------------------------ the report
def build_report(store, dev: str | None = None, *, samples: int = 2000, seed: int = 0,
                 eval_set: str | None = None) -> dict:
    """Every number of the tables: {"meta", "rows", "notes"}, rows in table order (NaN where a number is
    undefined, e.g. the std of one seed; `--json` writes those as null). `eval_set`: the question scores
    to read; by default `val` (the runs' `data.eval_file`), or the spec's one `eval_sets` entry where
    its runs have no eval_file."""
    store = Path(store)
    results = load_results(store)
    if eval_set is None:  # dev_path then finds the same set's file
        only = spec_eval_set(results)
        eval_set = only[0] if only and dev is None and run_eval_file(results) is None else EVAL_SET
    dev = dev_path(store, results, dev)
    labels = read_labels(dev)
    scores: dict[str, dict[str, float]] = {}  # run -> qid -> F1 (0..1)
    for q in results["questions"]:
        if q["eval_set"] == eval_set:
            scores.setdefault(q["run"], {})[q["qid"]] = q["f1"]
    losses: dict[str, list] = {}
    updates: dict[str, dict[int, float]] = {}  # run -> position id -> fraction of steps
    for c in results["curves"]:
        if c["kind"] == "loss":
            losses.setdefault(c["run"], []).append((c["step"], c["value"]))
        elif c["kind"] == "position_updates":
            updates.setdefault(c["run"], {})[c["step"]] = c["value"]
    status = {(f"{r['dataset']}/{r['method']}", r["seed"]): r["status"] for r in results["runs"]}
    expected = expected_arms(results)
    notes = []

    # Finished runs with scores, by arm and seed.
    by_arm: dict[str, dict[int, dict]] = {}
    for r in results["runs"]:
        arm = f"{r['dataset']}/{r['method']}"
        if r["status"] != "finished":
            continue
        if not scores.get(r["name"]):
            notes.append(f"{r['name']}: finished but no `{eval_set}` question scores in the store; left out")
            status[(arm, r["seed"])] = "finished without question scores"
            continue
        unlabelled = sum(q not in labels for q in scores[r["name"]])
        if unlabelled:
            notes.append(f"{r['name']}: {unlabelled} of its {len(scores[r['name']])} scored questions are not in "
                         f"{dev}; left out (is --dev the file it was evaluated on?)")
        by_arm.setdefault(arm, {})[r["seed"]] = r
    for arm, seeds in expected.items():
        done = by_arm.get(arm, {})
        if len(done) < len(seeds):
            missing: dict[str, list[str]] = {}  # status -> seeds, e.g. {"running": ["seed3"]}
            for s in seeds:
                if s not in done:
                    missing.setdefault(status.get((arm, s), "not started"), []).append(f"seed{s}")
            why = "; ".join(f"{', '.join(v)}: {k}" for k, v in missing.items())
            notes.append(f"{arm}: {len(done)} of {len(seeds)} seeds finished ({why})")
    ignored = sorted(set(by_arm) - set(arm_order(by_arm)))
    if ignored:
        notes.append(f"not in the tables (neither a reference nor a {ARM_DATASET}/* arm): {', '.join(ignored)}")

    order = arm_order([a for a in dict.fromkeys([*expected, *sorted(by_arm)]) if a in by_arm])
    stats = {arm: {s: run_stats(scores[r["name"]], labels) for s, r in by_arm[arm].items()} for arm in order}
    has_floor, has_ceiling = FLOOR in stats, CEILING in stats
    if not has_floor or not has_ceiling:
        lacking = " and ".join(a for a, ok in ((CEILING, has_ceiling), (FLOOR, has_floor)) if not ok)
        notes.insert(0, f"no gap columns: no finished run of {lacking}"
                        + ("" if has_floor else "; no Δ columns either (they are taken against first/baseline)"))

    # Per-question F1 averaged over an arm's seeds, on the questions every run of the table has.
    common = set(labels)
    for arm in order:
        for r in by_arm[arm].values():
            common &= set(scores[r["name"]])
    common = sorted(common)
    later = [q for q in common if labels[q] in LATER]
    vectors = {arm: np.mean([[scores[r["name"]][q] for q in common] for r in by_arm[arm].values()], axis=0)
               for arm in order} if common else {}
    later_idx = np.array([labels[q] in LATER for q in common], dtype=bool)

    def seeds_of(arm, key):
        return {s: v[key] for s, v in stats[arm].items()}

    def cost(arm, key):
        vals = [r[key] for r in by_arm[arm].values() if r.get(key) is not None]
        return float(np.median(vals)) if vals else None

    rows = []
    for arm in order:
        st = stats[arm]
        row = {"arm": arm, "runs": len(st), "expected_runs": len(expected.get(arm, st)), "seeds": sorted(st)}
        for key in ("f1", "f1_later", "psi", "drop"):
            row[key], row[f"{key}_std"] = mean_std(list(seeds_of(arm, key).values()))
        row["by_bucket"] = {b: mean_std([v["by_bucket"][b] for v in st.values()])[0] for b in BUCKETS}
        if has_floor and arm != FLOOR:
            for key in ("f1", "f1_later"):
                row[f"delta_{key}"] = paired_ttest(seeds_of(arm, key), seeds_of(FLOOR, key))
        if has_floor and has_ceiling and common:
            for key, mask in (("gap", slice(None)), ("gap_later", later_idx)):
                row[key] = gap_bootstrap(vectors[arm][mask], vectors[FLOOR][mask], vectors[CEILING][mask],
                                         samples=samples, seed=seed)
        if has_floor and has_ceiling:
            for key, f1 in (("gap_seeds", "f1"), ("gap_later_seeds", "f1_later")):
                row[key] = gap_over_seeds(seeds_of(arm, f1), seeds_of(FLOOR, f1), seeds_of(CEILING, f1))
        row["train_seconds"], row["wall_seconds"] = cost(arm, "train_seconds"), cost(arm, "wall_seconds")
        if has_floor:
            for key in ("train_seconds", "wall_seconds"):
                base = cost(FLOOR, key)
                row[f"{key}_ratio"] = row[key] / base if row[key] is not None and base else None
        flat = [loss_flatness(losses.get(r["name"], [])) for r in by_arm[arm].values()]
        finals = [f["final"] for f in flat if f["final"] is not None]
        changes = [f["change"] for f in flat if f["change"] is not None]
        row["final_loss"], row["final_loss_std"] = mean_std(finals)
        row["loss_change"] = float(np.mean(changes)) if changes else None
        row["loss_change_runs"] = changes
        row["flat"] = bool(changes) and all(abs(c) < FLAT for c in changes)
        blocks = [loss_blocks(losses[r["name"]]) for r in by_arm[arm].values() if losses.get(r["name"])]
        width = max(map(len, blocks), default=0)
        row["loss_blocks"] = [mean_std([b[k] for b in blocks if k < len(b) and not math.isnan(b[k])])[0]
                              for k in range(width)]
        ranges = [id_range_updates(updates[r["name"]]) for r in by_arm[arm].values() if r["name"] in updates]
        row["id_updates"] = {k: float(np.mean([u[k] for u in ranges])) for k in ranges[0]} if ranges else None
        row["id_update_runs"] = len(ranges)
        rows.append(row)

    tests = [r[f"delta_{key}"] for r in rows for key in ("f1", "f1_later") if f"delta_{key}" in r]
    for t, adjusted in zip(tests, holm([t["p"] for t in tests])):
        t["p_holm"], t["family"] = adjusted, sum(x["p"] == x["p"] for x in tests)  # x == x: not NaN
    counts = {b: sum(labels[q] == b for q in common) for b in BUCKETS}
    meta = {"store": str(store), "dev": dev, "eval_set": eval_set, "questions": len(common),
            "later_questions": len(later), "bucket_questions": counts,
            "no_answer_questions": sum(labels[q] == NO_ANSWER for q in common),
            "samples": samples, "seed": seed, "gap": has_floor and has_ceiling, "delta": has_floor}
    return {"meta": meta, "rows": rows, "notes": notes}


# ------------------------------------------------------------------------------------ rendering
def _f(x, digits=1) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _ms(mean, std, n, digits=1) -> str:
    if mean is None or math.isnan(mean):
        return "–"
    return f"{_f(mean, digits)} ± {_f(std, digits)}" if n > 1 else f"{_f(mean, digits)} (1 run)"


def _p(x) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return "<0.001" if x < 0.001 else f"{x:.3f}"


def _delta(row, key) -> str:
    t = row.get(f"delta_{key}")
    if t is None:
        return "–"
    pairs = f", {t['n']} pairs" if t["n"] != row["runs"] else ""
    holm_p = f", Holm {_p(t['p_holm'])}" if t.get("family", 1) > 1 and "p_holm" in t else ""
    return f"{t['diff']:+.1f} (p {_p(t['p'])}{holm_p}{pairs})"


def _gap(row, key) -> str:
    if row["arm"] == CEILING:
        return "1 (ceiling)"
    if row["arm"] == FLOOR:
        return "0 (floor)"
    g = row.get(key)
    if g is None or math.isnan(g["value"]):
        return "–"
    return f"{g['value']:.2f} [{_f(g['ci_low'], 2)}, {_f(g['ci_high'], 2)}]"


def _gap_seeds(row, key) -> str:
    """The gap closed over seeds: mean [95% t-interval] (seeds), where the seeds support a number."""
    if row["arm"] in (CEILING, FLOOR):
        return "–"
    g = row.get(key)
    if g is None or not g["n"]:
        return "–"
    if g["n"] < 2:
        return f"{g['mean']:.2f} (1 seed)"
    return f"{g['mean']:.2f} [{_f(g['ci_low'], 2)}, {_f(g['ci_high'], 2)}] ({g['n']} seeds)"


def _cost(row, key) -> str:
    if row[key] is None:
        return "–"
    ratio = row.get(f"{key}_ratio")
    return f"{row[key]:.0f}" + (f" (×{ratio:.2f})" if ratio is not None else "")


def _loss(row) -> str:
    if row["loss_change"] is None:
        return "–"
    n_bad = sum(abs(c) >= FLAT for c in row["loss_change_runs"])
    verdict = "flat" if row["flat"] else f"not flat ({n_bad} of {len(row['loss_change_runs'])} runs)"
    return f"{100 * row['loss_change']:+.1f}% {verdict}"


def _table(head, body) -> str:
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                     + ["| " + " | ".join(r) + " |" for r in body])


def render_markdown(report: dict) -> str:
    meta, rows = report["meta"], report["rows"]
    n = meta["bucket_questions"]
    lines = [f"### First-sentence stress benchmark: {meta['store']}", "",
             f"Eval set `{meta['eval_set']}` ({meta['dev']}): {meta['questions']} questions every run has, "
             f"{meta['later_questions']} answered in sentence 2 or later (2+); by answer sentence "
             + ", ".join(f"{b}: {n[b]}" for b in BUCKETS) + ". F1 in points, mean ± std over seeds. "
             "Δ: paired by seed vs first/baseline (paired t-test p over seeds). "
             "Gap closed = (F1 − F1 first/baseline) / (F1 random/baseline − F1 first/baseline), 95% paired "
             f"bootstrap over questions ({meta['samples']} resamples, seed {meta['seed']}). PSI = 1 − min/max, "
             "drop = max − min over the sentence buckets 1..5+. Cost: median seconds per run (× first/baseline). "
             f"Final loss: mean of the last {FINAL_POINTS} logged points; loss change: last {WINDOW} steps vs the "
             f"{WINDOW} before (flat if |change| < {100 * FLAT:.0f}% in every run). The loss is each arm's "
             "training objective: for the de-biasing arms the ensemble's (plus learned-mixin+H's entropy "
             "penalty), not the main model's alone.", ""]
    if not rows:
        lines.append("No finished runs with question scores.")
    else:
        head = ["arm", "runs", "F1", "F1 2+"]
        if meta["delta"]:
            head += ["Δ F1", "Δ F1 2+"]
        if meta["gap"]:
            head += ["gap closed [95% CI, questions]", "gap closed 2+", "gap closed [95% CI t, seeds]",
                     "gap closed 2+ (seeds)"]
        head += ["PSI", "drop", "train s", "wall s", "final loss", "loss change"]
        body = []
        for r in rows:
            k = r["runs"]
            runs = f"{k}" if k == r["expected_runs"] else f"{k} of {r['expected_runs']}"
            cells = [r["arm"], runs, _ms(r["f1"], r["f1_std"], k), _ms(r["f1_later"], r["f1_later_std"], k)]
            if meta["delta"]:
                cells += [_delta(r, "f1"), _delta(r, "f1_later")]
            if meta["gap"]:
                cells += [_gap(r, "gap"), _gap(r, "gap_later"), _gap_seeds(r, "gap_seeds"),
                          _gap_seeds(r, "gap_later_seeds")]
            cells += [_ms(r["psi"], r["psi_std"], k, 2), _ms(r["drop"], r["drop_std"], k),
                      _cost(r, "train_seconds"), _cost(r, "wall_seconds"),
                      _ms(r["final_loss"], r["final_loss_std"], k, 3), _loss(r)]
            body.append(cells)
        lines += [_table(head, body), "", "F1 by answer sentence (mean over seeds):", ""]
        lines.append(_table(["arm"] + [f"{b} (n={n[b]})" for b in BUCKETS],
                            [[r["arm"]] + [_f(r["by_bucket"][b]) for b in BUCKETS] for r in rows]))
    if rows and any(r["loss_blocks"] or r["id_updates"] for r in rows):
        width = max(len(r["loss_blocks"]) for r in rows)
        ranges = [f"{lo}-{hi}" for lo, hi in ID_RANGES]
        lines += ["", f"How each arm trained: mean training loss per {BLOCK} steps, and the % of steps in which a "
                  "position id got a gradient (mean over the range's ids; over seeds):", ""]
        lines.append(_table(["arm"] + [f"loss {k * BLOCK}-{(k + 1) * BLOCK}" for k in range(width)]
                            + [f"ids {x}" for x in ranges],
                            [[r["arm"]] + [_f(r["loss_blocks"][k], 3) if k < len(r["loss_blocks"]) else "–"
                                           for k in range(width)]
                             + [_f(r["id_updates"][x]) if r["id_updates"] else "–" for x in ranges] for r in rows]))
    dropped = [f"{r['arm']} {k}: {r[k]['dropped']}" for r in rows for k in ("gap", "gap_later")
               if r.get(k) and r[k]["dropped"]]
    notes = report["notes"] + ([f"bootstrap resamples without a gap (ceiling <= floor), left out: {', '.join(dropped)}"]
                               if dropped else [])
    if notes:
        lines += ["", "Notes:"] + [f"- {x}" for x in notes]
    return "\n".join(lines) + "\n"


def _json_ready(x):
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {str(k): _json_ready(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_ready(v) for v in x]
    if isinstance(x, np.generic):
        return _json_ready(x.item())
    return x


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", required=True, help="the experiment folder (holds experiment.sqlite)")
    ap.add_argument("--dev", help="the dev file the runs were evaluated on (default: the spec's data.eval_file)")
    ap.add_argument("--samples", type=int, default=2000, help="bootstrap resamples of the questions")
    ap.add_argument("--seed", type=int, default=0, help="bootstrap RNG seed")
    ap.add_argument("--eval-set", help="question_scores.eval_set to read (default: val, the runs' data.eval_file; "
                                       "for a spec without one, its one eval_sets entry)")
    ap.add_argument("--out", help="also write the markdown here")
    ap.add_argument("--json", help="write the numbers here")
    args = ap.parse_args(argv)
    try:
        report = build_report(args.store, args.dev, samples=args.samples, seed=args.seed, eval_set=args.eval_set)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = render_markdown(report)
    print(text, end="")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text, encoding="utf-8")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(_json_ready(report), indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

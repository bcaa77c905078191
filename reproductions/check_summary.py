"""Check the reproductions' summary (reproductions/summary.yaml) against the archived records: every
number a summary row prints that summary.yaml ties to a store is recomputed from that store's
`experiment.sqlite` (`posbias.experiment.aggregation`) and must read the same, to the digits printed;
the row's text (its short and full cells, in summary.yaml itself) must print it; its verdict must be
one of the defined words; and a row whose numbers have no store must say so (`unchecked`, with the
reason), so that no number without a record lands unnoticed.

    python reproductions/check_summary.py [--summary reproductions/summary.yaml] [--page PAGE.md]

`--page`: a Markdown page with a summary table (paper | claim | ours | verdict | ...), such as a built
results/index.md; each of its rows must be a summary.yaml row. Exit code 0 when everything checks,
1 with one line per problem.

summary.yaml:
    verdicts: {word: definition, ...}     # the only verdict words a summary row may start with
    papers: {key: {name, title, about, specs}, ...}   # one results page each
    rows:
      - claim: "MaP_E > InD"              # a piece of the row's short claim cell, unique: the row's name
        paper: map                        # a key of `papers`
        verdict: partly                   # the row's verdict cells start with it
        short: {claim: ..., ours: ..., verdict: ...}   # the summary table's cells
        full: {claim: ..., ours: ..., verdict: ...}    # the row in full
        regime: ...                       # model, data, budget, seeds the verdict covers
        rerun: ["posbias experiment run ...", ...]
        experiments: [map_squad, ...]     # folders under docs/experiments/ (or diagnoses/NAME)
        checks:                           # numbers recomputed from a store
          - {store: docs/experiments/map_squad, eval_set: test, metric: EM, method: map_e,
             stat: delta, text: "+1.30"}
        unchecked: ["29.6 vs 65.3: ..."]    # numbers the row prints that are not recomputed here, and why
        primary: [...]                    # the claim's primary tests (reproductions/primary.py), or
                                          #   {none: "why no seed-level test decides it"}
        kind: mechanism check             # optional: a check of a mechanism, not of a claimed effect
A check of an archived diagnosis (`posbias diagnose ... --output-dir`, copied into the repository)
instead: {diagnosis: docs/diagnoses/NAME, key: "axes > dense: answer character > effect", text: "1.87"}.
A check of a run's curve (its store's `curves` table): {store, run, curve: position_updates, at: 64 |
range: [50, 300] with stat min/max | stat: last_nonzero, percent: true, text}.
A check's `stat`: mean, std, delta (method − baseline, paired by seed), p (t-test over seeds),
p_holm (Holm-adjusted over the store's report table), ci_low/ci_high (t-interval over seeds).
Optional keys: dataset (the store's data set name), baseline (another method than the spec's),
only (shell patterns of run names, as `experiment report --only`). The value is formatted with the
digits `text` shows; a leading + is kept, and "−" (U+2212) reads as "-".

A check of the per-copy table (F1(α) on trained and untrained position ids, from a store's per-copy
scores): {store, copies: {method, alpha}, stat: trained_share | trained.delta | untrained.ci_low | ..., text}.

A check of one of the row's primary tests: {primary: 0, stat: diff | p | p_holm | p_size | ci_low |
ci_high | n, text: ...} (the test's index in the row's `primary` list; p one-sided in the paper's
direction, p_holm over the paper's primary tests, p_size one-sided against the paper's effect).
A secondary test, computed as a primary one is but outside the paper's family (no Holm): {secondary:
{...a primary test's keys...}, stat: diff | p | ci_low | ci_high | arm_mean | versus_mean | n, text}
(e.g. another arm's rear − front gap, or its F1 on one segment).

Every number a row prints in its `ours` and `verdict` cells (short and full) must be accounted for: the
last number of a check's `text` where the row prints that text, or a number listed in the head of an
`unchecked` entry (the part before its first ": "). Numbers that name the regime rather than a result
are exempt: a count before a unit ("3 seeds", "510 steps", "4,000 questions"), a setting ("k = 20",
"M = 128"), an id or index ("id 133", "seed 23456", "Table 3"), a metric's argument ("F1(10)"), the
confidence level of an interval ("95% CI"), and the paper's number where the row's claim cell prints it
("the paper's +1.07"). The claim cells quote the paper and are not scanned.
The verdict words follow the primary tests: "reproduces" needs every primary test to hold (one-sided,
Holm over the paper's primary tests, below 0.05), "does not reproduce" needs none to hold, and a
primary test whose effect is smaller than the paper's (its one-sided 95% bound excludes the paper's
number) must be said so in the row ("smaller than the paper's").
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from functools import lru_cache
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from posbias.experiment.aggregation import aggregate, load_results  # noqa: E402

sys.path.insert(0, str(ROOT / "reproductions"))
import primary as primary_module  # noqa: E402
import summary_file  # noqa: E402

STATS = ("mean", "std", "delta", "p", "p_holm", "ci_low", "ci_high")


@lru_cache(maxsize=None)
def _rows(store: str, baseline: str | None, only: tuple[str, ...] | None) -> list[dict]:
    results = load_results(ROOT / store, baseline=baseline, only=list(only) if only else None)
    return aggregate(results, bootstrap_samples=0)  # the t-tests only: bootstraps are not in the checks


def value(check: dict, primaries: list[dict] | None = None) -> float:
    """The number `check` asks for, recomputed from its store (or read from its archived diagnosis, or
    one of the row's primary tests: `primaries`, that row's computed tests in order)."""
    if "primary" in check:
        if primaries is None or not 0 <= int(check["primary"]) < len(primaries):
            raise LookupError(f"the row has no primary test {check['primary']}")
        if check.get("stat") not in primary_module.STATS:
            raise LookupError(f"primary test stat {check.get('stat')!r} is not one of {', '.join(primary_module.STATS)}")
        return float(primaries[int(check["primary"])][check["stat"]])
    if "secondary" in check:  # a test computed as a primary one is, outside the paper's Holm family
        if check.get("stat") not in primary_module.STATS or check["stat"] in ("p_holm", "family"):
            raise LookupError(f"secondary test stat {check.get('stat')!r} is not one of "
                              f"{', '.join(s for s in primary_module.STATS if s not in ('p_holm', 'family'))}")
        return float(_secondary(json.dumps(check["secondary"], sort_keys=True))[check["stat"]])
    if "diagnosis" in check:
        return _diagnosis_value(check)
    if "curve" in check:
        return _curve_value(check)
    if "copies" in check:
        return _copies_value(check)
    only = tuple(check["only"]) if check.get("only") else None
    rows = [r for r in _rows(check["store"], check.get("baseline"), only)
            if r["eval_set"] == check["eval_set"] and r["metric"] == check["metric"]
            and r["method"] == check["method"] and r["dataset"] == check.get("dataset")]
    if len(rows) != 1:
        raise LookupError(f"{len(rows)} report rows for {_where(check)}")
    r = rows[0]
    stat = check["stat"]
    if stat in ("mean", "std"):
        return r[stat]
    if "ttest" not in r:
        raise LookupError(f"no comparison to a baseline for {_where(check)}")
    return r["ttest"]["diff" if stat == "delta" else stat]


@lru_cache(maxsize=None)
def _secondary(spec: str) -> dict:
    return primary_module.compute(json.loads(spec))


def _curve_value(check: dict) -> float:
    """A number of a run's curve in its store's `curves` table (e.g. position_updates: the share of
    steps that updated each position id): `at` an id, or `range` [lo, hi] with stat min or max, or stat
    last_nonzero (the highest id with a nonzero value); `percent` scales shares to percent."""
    results = _store(check["store"])
    points = {c["step"]: c["value"] for c in results["curves"] if c["run"] == check["run"] and c["kind"] == check["curve"]}
    if not points:
        raise LookupError(f"{check['store']} has no {check['curve']} curve for run {check['run']}")
    stat = check.get("stat", "value")
    if stat == "last_nonzero":
        return float(max(k for k, v in points.items() if v > 0))
    if stat in ("min", "max"):
        lo, hi = check["range"]
        values = [v for k, v in points.items() if lo <= k <= hi]
        x = min(values) if stat == "min" else max(values)
    else:
        if check["at"] not in points:
            raise LookupError(f"{check['store']} {check['run']} {check['curve']} has no point {check['at']}")
        x = points[check["at"]]
    return float(x) * (100 if check.get("percent") else 1)


def _copies_value(check: dict) -> float:
    """A number of the report's "F1(α) on trained and untrained position ids" table
    (`posbias.tagging.copies.copy_rows`), recomputed from the store's per-copy scores and position-update
    curves: `copies` {method, alpha, eval_set (optional)}; stat trained_share, or PART.delta / PART.ci_low /
    PART.ci_high with PART trained or untrained."""
    want = check["copies"]
    rows = [r for r in _copy_rows(check["store"]) if r["method"] == want["method"]
            and r["alpha"] == int(want["alpha"]) and ("eval_set" not in want or r["eval_set"] == want["eval_set"])]
    if len(rows) != 1:
        raise LookupError(f"{len(rows)} per-copy rows for {_where(check)}")
    stat = check.get("stat", "")
    if stat == "trained_share":
        return float(rows[0]["trained_share"])
    part, _, key = stat.partition(".")
    if part not in ("trained", "untrained") or key not in ("delta", "ci_low", "ci_high"):
        raise LookupError(f"per-copy stat {stat!r} is not trained_share or (un)trained.delta/ci_low/ci_high")
    cell = rows[0][part]
    x = cell["delta"] if key == "delta" else cell["ci"][0 if key == "ci_low" else 1]
    if x is None:
        raise LookupError(f"no {stat} for {_where(check)}")
    return float(x)


@lru_cache(maxsize=None)
def _copy_rows(store: str) -> tuple[dict, ...]:
    """The store's per-copy table, computed once per store (every check of it reads the same table)."""
    from posbias.tagging.copies import copy_rows

    return tuple(copy_rows(_store(store)))


@lru_cache(maxsize=None)
def _store(store: str) -> dict:
    return load_results(ROOT / store)


@lru_cache(maxsize=None)
def _diagnosis(path: str) -> dict:
    return json.loads((ROOT / path / "diagnosis.json").read_text(encoding="utf-8"))


def _diagnosis_value(check: dict) -> float:
    """A number of an archived `posbias diagnose` output: `key` is a path of keys (and list indices)
    into its diagnosis.json, joined by " > "."""
    x = _diagnosis(check["diagnosis"])
    for part in check["key"].split(" > "):
        if isinstance(x, list):
            x = x[int(part)]
        elif isinstance(x, dict) and part in x:
            x = x[part]
        else:
            raise LookupError(f"{check['diagnosis']}/diagnosis.json has no {check['key']!r} ({part!r})")
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise LookupError(f"{check['diagnosis']}/diagnosis.json {check['key']!r} is not a number")
    return float(x)


def _where(check: dict) -> str:
    if "primary" in check:
        return f"primary test {check['primary']}"
    if "secondary" in check:
        t = check["secondary"]
        return f"secondary test {t.get('label') or t.get('method')} ({t.get('store') or t.get('diagnosis')})"
    if "curve" in check:
        return f"{check['store']} {check['run']} {check['curve']}"
    if "copies" in check:
        c = check["copies"]
        return f"{check['store']} per-copy {c.get('method')} copy {c.get('alpha')}"
    if "diagnosis" in check:
        return f"{check['diagnosis']}/diagnosis.json {check['key']}"
    parts = [check["store"], check.get("dataset"), check["eval_set"], check["metric"], check["method"]]
    return "/".join(str(p) for p in parts if p is not None) + (f" vs {check['baseline']}" if check.get("baseline") else "")


_NUMBER = re.compile(r"(?<![\w.])([+\-−]?)(<?)(\d+(?:\.(\d+))?)(?![\w(])")


def formatted(x: float, text: str) -> str:
    """`x` written as `text` writes its number: the same digits after the point, a sign where `text`
    has one (− or +), `<0.001` kept for p-values below it."""
    found = list(_NUMBER.finditer(text))  # the last number: "k = 5 −11.87" checks −11.87
    if not found:
        raise ValueError(f"no number in {text!r}")
    m = found[-1]
    sign, less, _, frac = m.groups()
    if less:
        bound = float(m.group(3))
        return f"<{m.group(3)}" if x < bound else f"{x:.{len(m.group(3).split('.')[-1])}f}"
    digits = len(frac) if frac else 0
    out = f"{abs(x):.{digits}f}"
    if x < 0 and float(out) != 0:
        out = ("-" if sign == "-" else "−") + out  # the rows write U+2212
    elif sign == "+":
        out = "+" + out
    return out


CELLS = ("claim", "ours", "verdict")
SCANNED = ("ours", "verdict")  # the cells whose every number must be accounted for (the claim cells quote the paper)

_VALUE = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
# A number as the rows print it: a sign, "<" for p-values, a range "12–22", a trailing %. Not a part of a
# name ("MiniLM-L6", "D_50", "bf16", "1e-4", "NDCG@10", "CoNLL-2003", "T_100^(2)", "F1(10)").
_PRINTED = re.compile(rf"(?<![\w.^/@])(?<!\w-)(?<!\w\()(?<!\^\()([+\-−]?)(<\s?)?((?:{_VALUE})(?:–(?:{_VALUE}))?%?)(?![\w(]|\.\d)")
_UNIT_AFTER = re.compile(r"(?:[- ]|\+ )?(?:seeds?|steps?|questions?|epochs?|runs?|examples?|sentences?|words?|tokens?|"
                         r"characters?|copies|CPU|cores?|GPUs?|minutes|instances|passages|documents|tests|ids|q\b|"
                         r"th\b|nd\b|rd\b|st\b|×|CI\b)")
_SETTING_BEFORE = re.compile(r"(?:\b[A-Za-zα]+ = |§\s?|\b(?:seeds?|ids?|Table|Fig\.|Eq\.|step|batch|lr|copy|position|token|"
                             r"sentences?|layer|top|chance)\s)$")
# What a rendered Results page must not carry: a lab notebook's dates, session and queue words, and paths
# that exist only on the machines the runs were made on (a re-run reads data through `shared:` paths).
NOTEBOOK = re.compile(r"\b20\d\d-\d\d-\d\d\b|\bsessions?\b|\bqueue[ds]?\b|/tmp/|\.\./shared|\bthis morning\b|"
                      r"\bnext sessions?\b|\bprepared and queued\b", re.IGNORECASE)


_UNIT_SOON = re.compile(r"(?: [A-Za-z_][\w-]*){1,2}(?= (?:seeds?|steps?|questions?|epochs?|examples?|sentences?|words?|"
                        r"tokens?|documents|passages)\b)")


def printed_numbers(text: str, regime: bool = False) -> list[re.Match]:
    """The numbers of a cell that state a result: every number but the regime's (counts before a unit,
    settings, ids, a metric's argument, an interval's level). `regime`: the text describes the setup, where
    a count may stand one or two words before its unit ("8,000 SQuAD training questions")."""
    out = []
    for m in _PRINTED.finditer(text):
        if _UNIT_AFTER.match(text, m.end()) or _SETTING_BEFORE.search(text[:m.start()]):
            continue
        if regime and _UNIT_SOON.match(text, m.end()):
            continue
        out.append(m)
    return out


def listed_numbers(row: dict) -> set[str]:
    """The numbers listed in the heads of a row's `unchecked` entries (before each entry's first ": ")."""
    return {m.group(3) for u in row.get("unchecked") or [] for m in _PRINTED.finditer(str(u).split(": ")[0])}


def unaccounted(row: dict) -> list[str]:
    """The numbers of a row's ours and verdict cells (short and full) and of its regime, which its paper's
    Results page prints too, that no check recomputes and no `unchecked` entry lists, each with a few
    characters of context."""
    listed = listed_numbers(row)
    quoted = " ".join(str((row.get(part) or {}).get("claim") or "") for part in ("short", "full"))
    out = []
    texts = [(part, cell, (row.get(part) or {}).get(cell)) for part in ("short", "full") for cell in SCANNED]
    figures = [("a figure's", "caption", f.get("caption")) for f in row.get("figures") or []]
    for part, cell, raw in texts + [("the", "regime", row.get("regime"))] + figures:
        if True:
            text = " ".join(str(raw or "").split())
            checked = set()
            for c in row.get("checks") or []:
                start = text.find(c["text"])
                while start >= 0:
                    inside = list(_PRINTED.finditer(c["text"]))
                    if inside:
                        checked.add(start + inside[-1].start(3))
                    start = text.find(c["text"], start + 1)
            for m in printed_numbers(text, regime=cell == "regime"):
                if text[:m.start()].endswith("paper's ") and m.group(3) in quoted:
                    continue  # the paper's number, as its claim cell quotes it
                if m.start(3) not in checked and m.group(3) not in listed:
                    out.append(f"{m.group(0)} ({part} {cell}: …{text[max(0, m.start() - 25):m.end() + 10]}…)")
    return out


def summary_rows(summary: dict) -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    """(claim cell, whole row, verdict cell) of each summary.yaml row's short cells and of its full
    text; a row without them gives empty strings."""
    def cells(row, part):
        c = row.get(part) or {}
        texts = [str(c.get(k) or "") for k in CELLS]
        return texts[0], " | ".join(texts), texts[2]

    return [cells(r, "short") for r in summary["rows"]], [cells(r, "full") for r in summary["rows"]]


def table_rows(page: str) -> list[tuple[str, str, str]]:
    """(claim cell, whole row, verdict cell) of each row of the Markdown summary tables in `page`
    (columns paper | claim | ours | verdict | ...)."""
    out, summary_table = [], False
    for line in page.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|"):
            summary_table = False
            continue
        if cells[0] == "paper":  # a header: a summary table has "ours" in its third column
            summary_table = len(cells) >= 5 and cells[2].startswith("ours")
            continue
        if not summary_table or (cells[0] and set(cells[0]) <= {"-", ":"}):  # another table, or the rule
            continue
        out.append((cells[1], line, cells[3]))
    return out


def check(summary: dict, page: str | None = None) -> list[str]:
    """The problems found, one line each. `page`: a Markdown page whose summary table's rows must
    all be summary.yaml's (none: summary.yaml alone)."""
    problems = []
    words = sorted(summary["verdicts"], key=len, reverse=True)
    papers = summary.get("papers") or {}
    short_table, full_table = summary_rows(summary)
    by_row: dict[str, list[dict]] = {}
    try:
        for t in primary_module.primary_tests(summary):
            by_row.setdefault(t["claim"], []).append(t)
    except (LookupError, ValueError, OSError) as e:
        problems.append(f"primary tests: {e}")
    for row, short, full in zip(summary["rows"], short_table, full_table):
        claim = row["claim"]
        if row.get("paper") not in papers:
            problems.append(f"{claim!r}: paper {row.get('paper')!r} is not one of summary.yaml's papers")
        same = [r["claim"] for r in summary["rows"] if claim in (r.get("short") or {}).get("claim", "")]
        if claim not in short[0]:
            problems.append(f"{claim!r}: the row's short claim cell does not contain its claim")
        elif len(same) != 1:
            problems.append(f"{claim!r}: {len(same)} rows of the summary's short table have this claim")
        for part in ("short", "full"):
            missing = [k for k in CELLS if not (row.get(part) or {}).get(k)]
            if missing:
                problems.append(f"{claim!r}: no {part} {', '.join(missing)} text")
        if not row.get("regime"):
            problems.append(f"{claim!r}: no regime")
        if not row.get("rerun"):
            problems.append(f"{claim!r}: no rerun commands")
        lines = [short, full]
        verdict = short[2]
        if row.get("verdict") not in summary["verdicts"]:
            problems.append(f"{claim!r}: verdict {row.get('verdict')!r} in summary.yaml is not one of the defined words")
        for _, _, v in lines:
            if not any(v.startswith(w) for w in words):
                problems.append(f"{claim!r}: verdict cell {v[:60]!r} does not start with a defined word")
            elif not v.startswith(str(row.get("verdict"))):
                problems.append(f"{claim!r}: verdict cell {v[:60]!r} is not summary.yaml's {row.get('verdict')!r}")
        if verdict.startswith("does not reproduce") and "(at this regime:" not in verdict:
            problems.append(f"{claim!r}: 'does not reproduce' without '(at this regime: …)'")
        printed = " ".join(line for _, line, _ in lines)
        primaries = by_row.get(claim, [])
        problems += _primary_problems(row, primaries, printed)
        for c in row.get("checks") or []:
            try:
                got = formatted(value(c, primaries), c["text"])
            except (LookupError, ValueError, OSError) as e:
                problems.append(f"{claim!r}: {c['text']!r}: {e}")
                continue
            want = list(_NUMBER.finditer(c["text"]))[-1].group(0)
            if got != want:
                problems.append(f"{claim!r}: {c['text']!r} printed, the record gives {got} ({_where(c)} {c.get('stat', '')})")
            if c["text"] not in printed:
                problems.append(f"{claim!r}: {c['text']!r} is checked but the summary row does not print it")
        if not row.get("checks") and not row.get("unchecked"):
            problems.append(f"{claim!r}: neither checks nor unchecked numbers")
        for number in unaccounted(row):
            problems.append(f"{claim!r}: {number} is printed but neither checked nor listed in `unchecked`")
    for i, text in enumerate(summary.get("findings") or []):
        text = " ".join(str(text).split())
        for m in printed_numbers(text):
            problems.append(f"findings bullet {i + 1}: prints {m.group(0)!r} (…{text[max(0, m.start() - 25):m.end() + 10]}…): "
                            "a finding names rows, whose numbers are checked, and prints none of its own")
    for key, paper in papers.items():
        if not any(r.get("paper") == key for r in summary["rows"]):
            problems.append(f"paper {key!r} has no row")
        for field in ("about", "name", "title"):
            text = " ".join(str((paper or {}).get(field) or "").split())
            for m in (printed_numbers(text) if field == "about" else []):
                problems.append(f"paper {key!r}: its about text prints {m.group(0)!r}: the page shows it unchecked; "
                                "move the number into a row")
            if NOTEBOOK.search(text):
                problems.append(f"paper {key!r}: its {field} reads like a lab notebook "
                                f"({NOTEBOOK.search(text).group(0)!r})")
    for row in summary["rows"]:
        spec = row.get("primary")
        rendered = [("regime", row.get("regime")), *(("rerun", c) for c in row.get("rerun") or []),
                    *(("unchecked list", u) for u in row.get("unchecked") or []),
                    *(("figure caption", f.get("caption")) for f in row.get("figures") or []),
                    ("primary", spec.get("none") if isinstance(spec, dict) else None),
                    *((f"{part} {cell}", (row.get(part) or {}).get(cell)) for part in ("short", "full") for cell in CELLS)]
        for where, text in rendered:
            m = NOTEBOOK.search(str(text or ""))
            if m:
                problems.append(f"{row['claim']!r}: its {where} reads like a lab notebook ({m.group(0)!r}): a Results "
                                "page carries no dates, session or queue words, nor paths of the machines the runs "
                                "were made on (read data through `shared:` paths)")
    if page is not None:
        listed = {r["claim"] for r in summary["rows"]}
        for c, _, _ in table_rows(page):  # every row of the page's table must be in summary.yaml
            if not any(claim in c for claim in listed):
                problems.append(f"summary row {c[:60]!r} is not in summary.yaml")
    return problems


def _primary_problems(row: dict, primaries: list[dict], printed: str) -> list[str]:
    """A row's primary tests against its verdict: named (or `none` with a reason), "reproduces" only when
    every one holds, "does not reproduce" only when none does, "smaller than the paper's" said where a
    test's effect is; a mechanism check labelled as such."""
    claim, verdict = row["claim"], str(row.get("verdict"))
    spec = row.get("primary")
    problems = []
    if not spec:
        problems.append(f"{claim!r}: no primary test (a list of tests, or {{none: reason}})")
    elif isinstance(spec, dict) and "none" in spec and not str(spec["none"]).strip():
        problems.append(f"{claim!r}: primary none without a reason")
    held = [primary_module.significant(t) for t in primaries]
    if primaries and verdict == "reproduces" and not all(held):
        problems.append(f"{claim!r}: verdict 'reproduces' but primary test(s) "
                        f"{', '.join(t['label'] for t, h in zip(primaries, held) if not h)} do not hold after Holm")
    if verdict == "does not reproduce" and any(held):
        problems.append(f"{claim!r}: verdict 'does not reproduce' but a primary test holds after Holm")
    if any(t["smaller"] for t in primaries) and "smaller than the paper's" not in printed:
        problems.append(f"{claim!r}: a primary test's effect is smaller than the paper's and the row does not say so")
    if row.get("kind") == "mechanism check" and "mechanism check" not in str((row.get("full") or {}).get("verdict")):
        problems.append(f"{claim!r}: a mechanism check whose verdict does not say so")
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--summary", default=str(ROOT / "reproductions" / "summary.yaml"))
    ap.add_argument("--page", help="also check that every row of this Markdown page's summary table is in summary.yaml")
    args = ap.parse_args(argv)
    try:
        summary = summary_file.load_summary(args.summary)
        page = summary_file.read_page(args.page) if args.page else None
    except summary_file.InputError as e:
        print(f"check_summary: {e}", file=sys.stderr)
        return 2
    problems = check(summary, page)
    for p in problems:
        print(p)
    n_checks = sum(len(r.get("checks") or []) for r in summary["rows"])
    n_unchecked = sum(len(r.get("unchecked") or []) for r in summary["rows"])
    print(f"{len(summary['rows'])} rows, {n_checks} numbers recomputed from their stores, {n_unchecked} not "
          f"recomputed (listed with the reason in summary.yaml): {'ok' if not problems else f'{len(problems)} problem(s)'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

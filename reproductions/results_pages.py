"""The Results pages of the documentation site, generated from reproductions/summary.yaml (the rows of
claims, their verdicts, primary tests, regimes and re-run commands), the archived stores under
docs/experiments/ (runs, methods and seeds of each experiment) and reproductions/which_method.py's page
per task. Nothing hand-written is rendered: each paper's measurement notes (reproductions/<paper>/NOTES.md)
stay in the repository, and reproductions/check_summary.py checks every number a page prints.

    python reproductions/results_pages.py --out DIR     # writes DIR/results/<page>.md

The site's build hook calls `pages()`; the generated pages are not committed (docs/results/ holds only
performance.md).
"""
from __future__ import annotations

import argparse
import json
import re
import sqlite3
import sys
import textwrap
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "reproductions"))
import primary as primary_module  # noqa: E402
import summary_file  # noqa: E402
SUMMARY = ROOT / "reproductions" / "summary.yaml"
EXPERIMENTS = ROOT / "docs" / "experiments"

# A paper's page name (a key of summary.yaml's `papers`) -> its folder under reproductions/.
FOLDERS = {"random-padding": "random_padding", "map": "map", "token-positional-bias": "token_positional_bias",
           "dyref": "dyref", "first-sentence": "first_sentence", "retrieval": "retrieval",
           "lost-in-the-middle": "generation"}


def load_summary(path: Path = SUMMARY) -> dict:
    """summary.yaml read bounded and checked for shape (`summary_file.load_summary`)."""
    return summary_file.load_summary(path)


def slug(text: str) -> str:
    """A stable anchor for a row's heading (set explicitly, so links do not depend on the toc's slugs)."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower().replace("*", "star").replace(">", " over ")).strip("-")


def pages(summary: dict | None = None) -> dict[str, str | bytes]:
    """Every Results page but performance.md: "results/<page>.md" -> Markdown, and the figures the rows show
    (a row's `figures`: a PNG an archived diagnosis wrote) -> their bytes under results/img/."""
    summary = summary if summary is not None else load_summary()
    out: dict[str, str | bytes] = {"results/index.md": index_page(summary)}
    for row in summary["rows"]:
        for fig in row.get("figures") or []:
            out[f"results/{figure_path(fig)}"] = (ROOT / fig["diagnosis"] / fig["file"]).read_bytes()
    for key in summary["papers"]:
        out[f"results/{key}.md"] = paper_page(summary, key)
    import which_method  # reproductions/which_method.py: the page per task, from the stores

    out["results/which-method.md"] = which_method.page()
    return out


def _wrap(text: str, first: str = "", indent: str = "") -> str:
    """`text` as Markdown lines of at most ~100 characters: `first` before the first line (a list
    marker), `indent` before the others."""
    return "\n".join(textwrap.wrap(" ".join(str(text).split()), width=100, initial_indent=first,
                                   subsequent_indent=indent or " " * len(first),
                                   break_long_words=False, break_on_hyphens=False))


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def summary_table(summary: dict, rows: list[dict], link: bool = True) -> str:
    """The summary table (paper | claim | ours | verdict | detail) of `rows`, in reproductions/check_summary.py's
    table format; the detail cell links to the row on its paper's page (`link`) or on this page, where the
    paper column is left out."""
    lines = ["| paper | claim (paper's number) | ours (number, seeds, model) | verdict | detail |",
             "|---|---|---|---|---|"]
    last = None
    for row in rows:
        paper = row["paper"]
        name = summary["papers"][paper]["name"] if paper != last else ""
        last = paper
        target = f"{paper}.md#{slug(row['claim'])}" if link else f"#{slug(row['claim'])}"
        s = row["short"]
        lines.append(f"| {_cell(name)} | {_cell(s['claim'])} | {_cell(s['ours'])} | {_cell(s['verdict'])} "
                     f"| [in full]({target}) |")
    if not link:  # one paper's page: no paper column
        lines = ["|" + line.split("|", 2)[2] for line in lines]
        lines[0] = lines[0].replace("| detail |", "| |")
    return "\n".join(lines) + "\n"


def _num(x: float, digits: int = 2, sign: bool = True) -> str:
    """A number as the rows print it: U+2212 for minus, + where `sign`."""
    if x != x:  # NaN
        return "–"
    out = f"{abs(x):.{digits}f}"
    if x < 0 and float(out) != 0:
        return "−" + out
    return ("+" if sign and float(out) != 0 else "") + out


def _p(x: float) -> str:
    if x != x:
        return "–"
    return "<0.001" if x < 0.001 else f"{x:.3f}"


def primary_table(summary: dict, tests: list[dict], with_paper: bool = True) -> str:
    """The primary tests of `tests` (primary_module.primary_tests rows): one line each."""
    head = ["claim", "primary test", "n", "Δ [95% CI]", "p (one-sided)", "Holm (family)",
            "paper's Δ", "at least the paper's? p"]
    if with_paper:
        head = ["paper"] + head
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for t in tests:
        test = t["test"]
        effect = test.get("paper_effect")
        size = "–" if effect is None else (_p(t["p_size"]) + (" (smaller)" if t["smaller"] else ""))
        held = " ✓" if primary_module.significant(t) else ""
        cells = [_cell(t["claim"]), _cell(t["label"]), str(t["n"]),
                 f"{_num(t['diff'])} [{_num(t['ci_low'], sign=False)}, {_num(t['ci_high'], sign=False)}]",
                 _p(t["p"]), f"{_p(t.get('p_holm', float('nan')))} ({t.get('family', 0)}){held}",
                 "–" if effect is None else _num(effect), size]
        if with_paper:
            cells = [_cell(summary["papers"][t["paper"]]["name"])] + cells
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


PRIMARY_TEXT = (
    "Each claim's verdict rests on one primary test, fixed in `reproductions/summary.yaml` before the "
    "verdict: one metric, one comparison, the paper's direction, tested one-sided over seeds (paired by "
    "seed; n is the seeds), or, for a diagnosis of one model, over its questions (paired by question; n is "
    "the questions). Holm's correction runs over each paper's primary tests (the family column); ✓ marks a test "
    "that holds at 0.05 after it. Where the paper gives an effect size, the last column tests whether ours "
    "is at least the paper's (one-sided; \"smaller\" when its 95% bound excludes the paper's number). "
    "Every other number in the rows is secondary: reported unadjusted, two-sided, and labelled so.")


def _counts(summary: dict) -> tuple[int, int]:
    rows = summary["rows"]
    return sum(len(r.get("checks") or []) for r in rows), sum(len(r.get("unchecked") or []) for r in rows)


def index_page(summary: dict) -> str:
    n_checks, n_unchecked = _counts(summary)
    primaries = primary_table(summary, primary_module.primary_tests(summary))
    verdicts = "\n".join(_wrap(f"**{word}**: {text}", "- ") for word, text in summary["verdicts"].items())
    findings = "\n".join(_wrap(text, "- ") for text in summary.get("findings") or [])
    papers = "\n".join(f"- [{p['name']}]({key}.md): {p['title']}" for key, p in summary["papers"].items())
    return f"""# Results

What reproduces of the papers whose methods posbias implements: one row per claimed effect, with the
paper's number, ours, and a verdict. Runs use MiniLM-L6 on a 2-core CPU unless a row says otherwise. Each
verdict rests on the claim's primary test (below); each paper's page has every row in full, its secondary
numbers with the paired bootstrap over questions or sentences beside the t-test over seeds ("p a / b":
t-test / bootstrap), the regime the verdict covers, the commands that re-run it, and the details of every
experiment. For a recommendation per task, see [Which method should I use?](which-method.md).

Speed and memory are on their own page: [Performance](performance.md).

## The papers

{papers}

## Verdicts

Four words, each with one definition:

{verdicts}

## Summary: what reproduces

{summary_table(summary, summary["rows"])}
{findings}

## Primary tests

{_wrap(PRIMARY_TEXT)}

{primaries}
## How the numbers are checked

The rows live in `reproductions/summary.yaml`, beside the records each number comes from.
`python reproductions/check_summary.py` recomputes {n_checks} numbers the rows print from the archived
experiment stores (`docs/experiments/NAME/experiment.sqlite`) and diagnoses (`docs/diagnoses/NAME/diagnosis.json`),
checks that each row prints them to the digits shown, that each verdict is one of the four words and
agrees with the row's primary tests, and that every other number a row prints is listed, in
{n_unchecked} entries, with the reason it is not recomputed (shown under each row on the paper's page):
an unlisted number fails the check. The pages here are generated from that file and the stores when the site is built.
"""


def paper_page(summary: dict, key: str) -> str:
    paper = summary["papers"][key]
    rows = [r for r in summary["rows"] if r["paper"] == key]
    parts = [f"# {paper['name']}\n",
             f"*{paper['title']}*\n",
             _wrap(paper["about"]) + "\n",
             f"Specs and scripts: `{paper['specs']}`. The verdict words are defined on [Results](index.md#verdicts); "
             "runs use MiniLM-L6 on a 2-core CPU unless a row says otherwise.\n",
             "## Claims\n",
             summary_table(summary, rows, link=False)]
    tests = [t for t in primary_module.primary_tests(summary) if t["paper"] == key]
    if tests:
        parts += ["## Primary tests\n", _wrap(PRIMARY_TEXT) + "\n", primary_table(summary, tests, with_paper=False)]
    for row in rows:
        parts.append(row_section(row))
    names = []
    for row in rows:
        names += [n for n in row.get("experiments") or [] if n not in names]
    parts += ["## Experiments\n", experiments_table(names)]
    return "\n".join(parts).rstrip() + "\n"


def figure_path(fig: dict) -> str:
    """Where a row's figure lies beside the Results pages: img/<diagnosis folder>-<file>."""
    return f"img/{Path(fig['diagnosis']).name}-{Path(fig['file']).name}"


def row_section(row: dict) -> str:
    full = row["full"]
    rerun = "\n".join(row.get("rerun") or [])
    checks = row.get("checks") or []
    tests = list(primary_module.tests_of(row)) + [c["secondary"] for c in checks if "secondary" in c]
    stores = sorted({c.get("store") or c.get("diagnosis") for c in checks if "primary" not in c and "secondary" not in c}
                    | {t.get("store") or t["diagnosis"] for t in tests})
    checked = (f"{len(checks)} numbers of this row are recomputed from "
               + ", ".join(f"`{s}`" for s in stores) + " by `python reproductions/check_summary.py`."
               if checks else "No number of this row is recomputed from a store.")
    unchecked = row.get("unchecked") or []
    note = ['??? note "How this row\'s numbers are checked"', _wrap(checked, "    ")]
    if unchecked:
        note += ["", "    Not recomputed, and why:", ""] + [_wrap(u, "    - ", "      ") for u in unchecked]
    spec = row.get("primary")
    if isinstance(spec, dict) and "none" in spec:
        primary = f"**Primary test:** none: {spec['none']}"
    else:
        primary = "**Primary test:** " + "; ".join(
            f"{t.get('label') or t.get('method')} ({primary_module.describe(t)}"
            + (f", the paper's {_num(t['paper_effect'])}" if t.get("paper_effect") is not None else "") + ")"
            for t in primary_module.tests_of(row))
    kind = f"*A {row['kind']}.* " if row.get("kind") else ""
    figures = [f"![{fig['caption']}]({figure_path(fig)})\n\n*{fig['caption']}*\n" for fig in row.get("figures") or []]
    return "\n".join([
        f"## {row['claim']} {{#{slug(row['claim'])}}}\n",
        _wrap(f"{kind}**Verdict: {full['verdict']}**") + "\n",
        _wrap(primary, "- ", "  "),
        _wrap(f"**The paper:** {full['claim']}", "- ", "  "),
        _wrap(f"**Ours:** {full['ours']}", "- ", "  "),
        _wrap(f"**Regime:** {row['regime']}", "- ", "  ") + "\n",
        "Re-run:\n",
        "```bash",
        rerun,
        "```\n",
        *figures,
        "\n".join(note) + "\n",
    ])


def store_facts(name: str) -> dict:
    """Runs, methods, seeds and data sets of an archived experiment, read from its experiment.sqlite
    (read-only); a folder archived as report.md only, or a diagnosis, says so."""
    if name.startswith("diagnoses/"):
        path = ROOT / "docs" / name
        facts = {"kind": "diagnosis", "report": f"docs/{name}/diagnosis.md"}
        info = path / "run_info.json"
        if info.exists():
            facts["run_info"] = json.loads(info.read_text(encoding="utf-8"))
        return facts
    folder = EXPERIMENTS / name
    facts = {"kind": "store", "report": f"docs/experiments/{name}/report.md"}
    db = folder / "experiment.sqlite"
    if not db.exists():
        facts["kind"] = "report only"
        return facts
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        runs = con.execute("SELECT method, seed, dataset, status FROM runs").fetchall()
    finally:
        con.close()
    facts["runs"] = len(runs)
    facts["finished"] = sum(1 for r in runs if r[3] == "finished")
    facts["methods"] = sorted({r[0] for r in runs})
    facts["seeds"] = sorted({r[1] for r in runs if r[1] is not None})
    facts["datasets"] = sorted({r[2] for r in runs if r[2]})
    return facts


def experiments_table(names: list[str]) -> str:
    lines = ["| experiment | runs | methods | seeds | data sets | report |", "|---|---|---|---|---|---|"]
    for name in names:
        f = store_facts(name)
        if f["kind"] == "store":
            runs = f"{f['runs']}" + ("" if f["finished"] == f["runs"] else f" ({f['finished']} finished)")
            lines.append(f"| `{name}` | {runs} | {', '.join(f['methods'])} | {', '.join(map(str, f['seeds']))} "
                         f"| {', '.join(f['datasets']) or '–'} | `{f['report']}` |")
        elif f["kind"] == "diagnosis":
            lines.append(f"| `{name}` | one diagnosis | – | – | – | `{f['report']}` |")
        else:
            lines.append(f"| `{name}` | archived as report only | – | – | – | `{f['report']}` |")
    return ("\n".join(lines) + "\n\n" + _wrap(
        "The folders are in the repository, not on this site. Each holds the experiment's spec "
        "(`experiment.yaml`) and report, and, unless archived as a report only, its store "
        "(`experiment.sqlite`), from which `posbias experiment report docs/experiments/NAME` rebuilds the report.") + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder to write results/<page>.md into")
    ap.add_argument("--summary", default=str(SUMMARY))
    args = ap.parse_args(argv)
    try:
        summary = load_summary(Path(args.summary))
    except summary_file.InputError as e:
        print(f"results_pages: {e}", file=sys.stderr)
        return 2
    for rel, text in pages(summary).items():
        target = Path(args.out) / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):  # a row's figure
            target.write_bytes(text)
        else:
            target.write_text(text, encoding="utf-8")
        print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())

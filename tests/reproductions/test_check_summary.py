"""reproductions/check_summary.py: the summary rows in reproductions/summary.yaml against the archived
stores. The real summary must check; a changed number, an undefined verdict word, a row summary.yaml
does not know or a 'does not reproduce' without its regime must each be caught."""
from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("check_summary", ROOT / "reproductions" / "check_summary.py")
cs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cs)

SUMMARY_PATH = ROOT / "reproductions" / "summary.yaml"
SUMMARY = yaml.safe_load(SUMMARY_PATH.read_text(encoding="utf-8"))


def _edited(claim: str, parts: tuple[str, ...], cell: str, old: str, new: str) -> dict:
    """A copy of the summary with `old` replaced by `new` (once) in one row's cell, in each of `parts`
    ("short": the summary table's cells, "full": the row in full)."""
    summary = copy.deepcopy(SUMMARY)
    row = next(r for r in summary["rows"] if r["claim"] == claim)
    for part in parts:
        assert old in row[part][cell]
        row[part][cell] = row[part][cell].replace(old, new, 1)
    return summary


def test_the_summary_matches_its_records():
    assert cs.check(SUMMARY) == []
    assert cs.main([]) == 0


def test_every_short_row_has_a_full_row_and_the_verdict_words_are_the_defined_four():
    short, full = cs.summary_rows(SUMMARY)
    assert len(short) == len(full) == len(SUMMARY["rows"]) >= 15
    assert all(s[0] and s[2] and f[0] and f[2] for s, f in zip(short, full))
    assert set(SUMMARY["verdicts"]) == {"reproduces", "partly", "does not reproduce", "untested in a comparable regime"}


def test_a_number_that_differs_from_its_record_is_caught():
    changed = _edited("MaP_E > InD", ("short", "full"), "ours", "+1.30 EM (p 0.018", "+1.31 EM (p 0.018")
    problems = cs.check(changed)  # the short and the full row
    assert any("'+1.30 EM' is checked but the summary row does not print it" in p for p in problems), problems


def test_a_digit_changed_in_a_copy_of_summary_yaml_fails_the_command(tmp_path):
    text = SUMMARY_PATH.read_text(encoding="utf-8")
    assert text.count("−1.21 F1 (p 0.079 /") == 1  # MaP_F's row in full
    copy_path = tmp_path / "summary.yaml"
    copy_path.write_text(text.replace("−1.21 F1 (p 0.079 /", "−1.21 F1 (p 0.078 /"), encoding="utf-8")
    assert cs.main(["--summary", str(copy_path)]) == 1
    problems = cs.check(yaml.safe_load(copy_path.read_text(encoding="utf-8")))
    assert problems == ["'MaP_F > InD': 'p 0.079' is checked but the summary row does not print it"]


def test_a_record_that_differs_from_the_printed_number_is_caught():
    rows = [dict(r) for r in SUMMARY["rows"]]
    map_e = next(r for r in rows if r["claim"] == "MaP_E > InD")
    map_e["checks"] = [dict(c, method="vcp") if c["text"] == "+1.30 EM" else c for c in map_e["checks"]]
    problems = cs.check(dict(SUMMARY, rows=rows))
    assert any("'+1.30 EM' printed, the record gives −1.58" in p for p in problems), problems


def test_undefined_verdicts_rows_and_regimes_are_caught():
    problems = cs.check(_edited("MaP_E > InD", ("short",), "verdict", "partly (EM: the paper's size", "reproduces in EM ("))
    assert any("is not summary.yaml's 'partly'" in p for p in problems), problems
    problems = cs.check(_edited("MaP > VCP with BiDAF", ("short",), "verdict", "untested in a comparable regime", "does not"))
    assert any("does not start with a defined word" in p for p in problems), problems
    bare = _edited("MaP_F > InD", ("short",), "verdict", "does not reproduce (at this regime: MiniLM-L6, 510 steps)",
                   "does not reproduce")
    assert any("without '(at this regime" in p for p in cs.check(bare))
    # A page whose summary table has a row summary.yaml does not know (a stale copy of the table):
    page = "| paper | claim | ours | verdict | detail |\n|---|---|---|---|---|\n" + "".join(
        f"| | {s[0]} | x | {s[2]} | |\n" for s in cs.summary_rows(SUMMARY)[0])
    assert cs.check(SUMMARY, page) == []
    rows = [r for r in SUMMARY["rows"] if r["claim"] != "UD EWT POS"]
    assert any("is not in summary.yaml" in p for p in cs.check(dict(SUMMARY, rows=rows), page))


def test_a_row_needs_its_paper_its_cells_its_regime_and_how_to_rerun_it():
    summary = copy.deepcopy(SUMMARY)
    row = summary["rows"][0]
    row["paper"] = "nowhere"
    del row["full"]["ours"], row["regime"], row["rerun"]
    problems = cs.check(summary)
    for want in ("paper 'nowhere' is not one of summary.yaml's papers", "no full ours text", "no regime", "no rerun commands"):
        assert any(want in p for p in problems), (want, problems)


@pytest.mark.parametrize("value, text, want", [(-11.8733, "k = 5 −11.87", "−11.87"), (0.3747, "p 0.38", "0.37"),
                                               (0.0004, "p <0.001", "<0.001"), (1.296, "+1.30 EM", "+1.30"),
                                               (-0.004, "−0.00", "0.00"), (2.0, "F1(10) 2", "2")])
def test_numbers_are_written_as_the_text_writes_them(value, text, want):
    assert cs.formatted(value, text) == want


def test_a_diagnosis_number_is_read_from_its_archived_json():
    """A row tied to an archived `posbias diagnose` output (docs/diagnoses/...): a printed number that
    differs from its diagnosis.json, or a key that is not there, is caught."""
    rows = [dict(r) for r in SUMMARY["rows"]]
    ret = next(r for r in rows if r.get("checks") and "diagnosis" in r["checks"][0])
    first = ret["checks"][0]
    assert cs.check(dict(SUMMARY, rows=rows)) == []
    ret["checks"] = [dict(first, key=first["key"].replace("> 0 >", "> 1 >"))] + ret["checks"][1:]  # another bucket
    problems = cs.check(dict(SUMMARY, rows=rows))
    assert any(f"{first['text']!r} printed, the record gives" in p for p in problems), problems
    ret["checks"] = [dict(first, key="axes > nowhere")]
    assert any("has no 'axes > nowhere'" in p for p in cs.check(dict(SUMMARY, rows=rows)))

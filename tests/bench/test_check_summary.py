"""bench/check_summary.py: BENCHMARKS.md's summary against the archived stores (issue 47). The real
summary must check; a changed number, an undefined verdict word, a row summary.yaml does not know
or a 'does not reproduce' without its regime must each be caught."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("check_summary", ROOT / "bench" / "check_summary.py")
cs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cs)

SUMMARY = yaml.safe_load((ROOT / "bench" / "summary.yaml").read_text(encoding="utf-8"))
BENCHMARKS = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")


def test_the_summary_matches_its_records():
    assert cs.check(SUMMARY, BENCHMARKS) == []
    assert cs.main([]) == 0


def test_every_short_row_has_a_full_row_and_the_verdict_words_are_the_defined_four():
    short, full = cs.summary_rows(BENCHMARKS)
    assert len(short) == len(full) == len(SUMMARY["rows"]) >= 15
    assert set(SUMMARY["verdicts"]) == {"reproduces", "partly", "does not reproduce", "untested in a comparable regime"}


def test_a_number_that_differs_from_its_record_is_caught():
    changed = BENCHMARKS.replace("+1.30 EM (p 0.018", "+1.31 EM (p 0.018")  # the short and the full row
    assert changed != BENCHMARKS
    problems = cs.check(SUMMARY, changed)
    assert any("'+1.30 EM' is checked but the summary row does not print it" in p for p in problems), problems


def test_a_record_that_differs_from_the_printed_number_is_caught():
    rows = [dict(r) for r in SUMMARY["rows"]]
    map_e = next(r for r in rows if r["claim"] == "MaP_E > InD")
    map_e["checks"] = [dict(c, method="vcp") if c["text"] == "+1.30 EM" else c for c in map_e["checks"]]
    problems = cs.check(dict(SUMMARY, rows=rows), BENCHMARKS)
    assert any("'+1.30 EM' printed, the record gives −1.58" in p for p in problems), problems


def test_undefined_verdicts_rows_and_regimes_are_caught():
    problems = cs.check(SUMMARY, BENCHMARKS.replace("| partly (EM: the paper's size", "| reproduces in EM (", 1))
    assert any("is not summary.yaml's 'partly'" in p for p in problems), problems
    problems = cs.check(SUMMARY, BENCHMARKS.replace("| untested in a comparable regime |", "| does not |", 1))
    assert any("does not start with a defined word" in p for p in problems), problems
    bare = BENCHMARKS.replace("| does not reproduce (at this regime: MiniLM-L6, 510 steps) |", "| does not reproduce |", 1)
    assert any("without '(at this regime" in p for p in cs.check(SUMMARY, bare))
    rows = [r for r in SUMMARY["rows"] if r["claim"] != "UD EWT POS"]
    assert any("is not in summary.yaml" in p for p in cs.check(dict(SUMMARY, rows=rows), BENCHMARKS))


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
    assert cs.check(dict(SUMMARY, rows=rows), BENCHMARKS) == []
    ret["checks"] = [dict(first, key=first["key"].replace("> 0 >", "> 1 >"))] + ret["checks"][1:]  # another bucket
    problems = cs.check(dict(SUMMARY, rows=rows), BENCHMARKS)
    assert any(f"{first['text']!r} printed, the record gives" in p for p in problems), problems
    ret["checks"] = [dict(first, key="axes > nowhere")]
    assert any("has no 'axes > nowhere'" in p for p in cs.check(dict(SUMMARY, rows=rows), BENCHMARKS))

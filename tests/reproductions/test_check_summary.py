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
    changed = _edited("MaP_E > InD", ("short",), "ours", "EM +1.30 on the test set", "EM +1.31 on the test set")
    row = next(r for r in changed["rows"] if r["claim"] == "MaP_E > InD")
    row["full"]["ours"] = row["full"]["ours"].replace("EM +1.30 on", "EM +1.31 on")
    problems = cs.check(changed)  # the short and the full row
    assert any("'EM +1.30' is checked but the summary row does not print it" in p for p in problems), problems


def test_a_digit_changed_in_a_copy_of_summary_yaml_fails_the_command(tmp_path):
    text = SUMMARY_PATH.read_text(encoding="utf-8")
    assert text.count("two-sided p 0.079, bootstrap") == 1  # MaP_F's row in full
    copy_path = tmp_path / "summary.yaml"
    copy_path.write_text(text.replace("two-sided p 0.079, bootstrap", "two-sided p 0.078, bootstrap"), encoding="utf-8")
    assert cs.main(["--summary", str(copy_path)]) == 1
    problems = cs.check(yaml.safe_load(copy_path.read_text(encoding="utf-8")))
    assert problems[0] == "'MaP_F > InD': 'p 0.079' is checked but the summary row does not print it"
    assert any("0.078" in p and "neither checked nor listed" in p for p in problems), problems


def test_a_record_that_differs_from_the_printed_number_is_caught():
    rows = [dict(r) for r in SUMMARY["rows"]]
    map_e = next(r for r in rows if r["claim"] == "MaP_E > InD")
    map_e["checks"] = [dict(c, method="vcp") if c["text"] == "EM +1.30" else c for c in map_e["checks"]]
    problems = cs.check(dict(SUMMARY, rows=rows))
    assert any("'EM +1.30' printed, the record gives −1.58" in p for p in problems), problems


def test_undefined_verdicts_rows_and_regimes_are_caught():
    problems = cs.check(_edited("MaP_E > InD", ("short",), "verdict", "partly (F1 in the paper's", "reproduces in F1 ("))
    assert any("is not summary.yaml's 'partly'" in p for p in problems), problems
    problems = cs.check(_edited("MaP > VCP with BiDAF", ("short",), "verdict", "untested in a comparable regime", "does not"))
    assert any("does not start with a defined word" in p for p in problems), problems
    bare = _edited("MaP_F > InD", ("short",), "verdict",
                   "does not reproduce (at this regime: MiniLM-L6, 510 steps; smaller than the paper's +0.21)",
                   "does not reproduce, smaller than the paper's")
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


# ------------------------------------------------------------------------------ every printed number


def test_an_unlisted_number_in_a_row_fails_and_listing_it_with_a_reason_passes():
    changed = _edited("MaP_F > InD", ("full",), "ours", "Same runs", "Same runs, 12.34 F1 on a hunch")
    problems = cs.check(changed)
    assert any("'MaP_F > InD': 12.34" in p and "neither checked nor listed" in p for p in problems), problems
    row = next(r for r in changed["rows"] if r["claim"] == "MaP_F > InD")
    row["unchecked"] = list(row.get("unchecked") or []) + ["12.34: a hunch, not a record"]
    assert cs.check(changed) == []


@pytest.mark.parametrize("text, want", [
    ("3 seeds, 510 steps on 8,000 questions, k = 20, M = 128", []),
    ("F1(10) −0.73 (p 0.85), 95% CI [−2.99, 1.54]", ["−0.73", "0.85", "−2.99", "1.54"]),
    ("MiniLM-L6 on CoNLL-2003 D_50, lr 1e-4, NDCG@10 77.45", ["77.45"]),
    ("ids 50–300 in 93.6–98.1% of steps, id 64 in 80.2%", ["93.6–98.1%", "80.2%"]),
    ("p <0.001, bootstrap < 0.001", ["<0.001", "< 0.001"]),
])
def test_the_numbers_a_cell_prints_are_the_results_not_the_regime(text, want):
    assert [m.group(0).strip() for m in cs.printed_numbers(text)] == want


def test_a_finding_that_prints_a_number_fails():
    summary = copy.deepcopy(SUMMARY)
    summary["findings"] = list(summary["findings"]) + ["**New.** CP gains +2.16 here."]
    assert any("prints '+2.16'" in p for p in cs.check(summary))


def test_a_quoted_paper_number_must_be_the_claim_cells():
    changed = _edited("MaP_F > InD", ("full",), "ours", "smaller than the paper's +0.21", "smaller than the paper's +0.31")
    problems = cs.check(changed)
    assert any("+0.31" in p and "neither checked nor listed" in p for p in problems), problems


def test_a_curve_number_is_recomputed_from_the_store():
    rows = copy.deepcopy(SUMMARY["rows"])
    row = next(r for r in rows if r.get("kind") == "mechanism check")
    first = next(c for c in row["checks"] if c.get("curve") and c.get("at") == 64)
    assert cs.value(first) == pytest.approx(80.17, abs=0.01)
    row["checks"] = [dict(c, at=65) if c is first else c for c in row["checks"]]
    problems = cs.check(dict(SUMMARY, rows=rows))
    assert any("'id 64 in 80.2%' printed, the record gives" in p for p in problems), problems


def test_a_secondary_test_is_recomputed_outside_the_holm_family():
    """Another arm's segment numbers (the Random Padding control's augment arm): computed as a primary
    test is, not counted in the paper's family; a wrong arm is caught."""
    rows = copy.deepcopy(SUMMARY["rows"])
    row = next(r for r in rows if r["claim"] == "Positive control: Random Padding with untrained rear positions")
    rear = next(c for c in row["checks"] if "secondary" in c and c["text"] == "100.0%): rear +3.65")
    assert cs.value(rear) == pytest.approx(3.645, abs=0.01)
    assert rear["secondary"]["method"] == "random_padding_augment"
    families = {t["family"] for t in cs.primary_module.primary_tests(SUMMARY) if t["paper"] == "random-padding"}
    assert families == {2}  # the paper's two primary tests; the arms' secondary tests are not in it
    row["checks"] = [dict(c, secondary=dict(c["secondary"], method="random_padding_cap64")) if c is rear else c
                     for c in row["checks"]]
    problems = cs.check(dict(SUMMARY, rows=rows))
    assert any("'100.0%): rear +3.65' printed, the record gives +1.16" in p for p in problems), problems
    with pytest.raises(LookupError, match="secondary test stat 'p_holm'"):
        cs.value(dict(rear, stat="p_holm"))


def test_a_per_copy_number_is_recomputed_from_the_store():
    """The CP control's split of F1(10) by trained and untrained position ids (the report's per-copy
    table, from the store's per-copy scores and position-update curves): a wrong copy is caught."""
    rows = copy.deepcopy(SUMMARY["rows"])
    row = next(r for r in rows if r["claim"] == "Positive control: CP with untrained rear positions")
    checks = [c for c in row["checks"] if "copies" in c]
    assert {c["stat"] for c in checks} >= {"trained_share", "trained.delta", "untrained.delta"}
    share = next(c for c in checks if c["stat"] == "trained_share")
    assert 0 < cs.value(share) < 100
    row["checks"] = [dict(c, copies=dict(c["copies"], alpha=9)) if c is share else c for c in row["checks"]]
    problems = cs.check(dict(SUMMARY, rows=rows))
    assert any(f"{share['text']!r} printed, the record gives" in p for p in problems), problems
    with pytest.raises(LookupError, match="per-copy stat 'trained.p'"):
        cs.value(dict(share, stat="trained.p"))
    with pytest.raises(LookupError, match="0 per-copy rows"):
        cs.value(dict(share, copies={"method": "rpp", "alpha": 10}))


# ------------------------------------------------------------------------------ primary tests


def _row(summary, claim):
    return next(r for r in summary["rows"] if r["claim"] == claim)


def test_every_row_names_its_primary_test_or_why_it_has_none():
    for row in SUMMARY["rows"]:
        spec = row.get("primary")
        assert spec, row["claim"]
        if isinstance(spec, dict):
            assert str(spec["none"]).strip(), row["claim"]
        else:
            for t in spec:
                assert t["direction"] in ("greater", "less"), (row["claim"], t)
                assert (t.get("metric") and t.get("store")) or (t.get("diagnosis") and t.get("scores")), (row["claim"], t)
    summary = copy.deepcopy(SUMMARY)
    del _row(summary, "MaP_F > InD")["primary"]
    assert any("'MaP_F > InD': no primary test" in p for p in cs.check(summary))


def test_the_verdict_must_follow_the_primary_tests():
    summary = copy.deepcopy(SUMMARY)
    _row(summary, "MaP_E > InD")["verdict"] = "reproduces"
    assert any("'MaP_E > InD': verdict 'reproduces' but primary test(s)" in p for p in cs.check(summary))
    summary = copy.deepcopy(SUMMARY)
    _row(summary, "CP lifts F1(10)")["verdict"] = "does not reproduce"
    assert any("'CP lifts F1(10)': verdict 'does not reproduce' but a primary test holds" in p for p in cs.check(summary))


def test_an_effect_smaller_than_the_papers_must_be_said():
    summary = copy.deepcopy(SUMMARY)
    row = _row(summary, "RPP lifts F1(10)")
    for part in ("short", "full"):
        for cell in ("ours", "verdict"):
            row[part][cell] = row[part][cell].replace("smaller than the paper's", "unlike the paper's")
    assert any("smaller than the paper's and the row does not say so" in p for p in cs.check(summary))


def test_holm_runs_over_each_papers_primary_tests():
    tests = cs.primary_module.primary_tests(SUMMARY)
    for paper in {t["paper"] for t in tests}:
        family = [t for t in tests if t["paper"] == paper]
        assert all(t["family"] == len(family) for t in family)
        ps = sorted(t["p"] for t in family)
        # Holm: the smallest p times the family size (capped at 1)
        smallest = min(family, key=lambda t: t["p"])
        assert smallest["p_holm"] == pytest.approx(min(1.0, ps[0] * len(family)))


def test_a_result_in_a_regime_or_an_about_text_fails_a_count_does_not():
    summary = copy.deepcopy(SUMMARY)
    row = next(r for r in summary["rows"] if r["claim"] == "MaP_F > InD")
    row["regime"] = row["regime"] + " Baseline F1 61.23 on 2,000 dev questions."
    problems = cs.check(summary)
    assert any("'MaP_F > InD': 61.23 (the regime" in p for p in problems), problems
    assert not any("InD': 2,000 (" in p for p in problems)  # a count before its unit names the regime
    summary = copy.deepcopy(SUMMARY)
    summary["papers"]["map"]["about"] += " It gains 1.07 F1."
    assert any("'map': its about text prints '1.07'" in p for p in cs.check(summary))
    assert [m.group(0) for m in cs.printed_numbers("8,000 SQuAD training questions, 19.63 F1", regime=True)] == ["19.63"]
    assert [m.group(0) for m in cs.printed_numbers("score 42.50 on dense questions")] == ["42.50"]


@pytest.mark.parametrize("field, text", [("regime", "measured on 2026-11-28"), ("rerun", "--data ../shared/data/x.json"),
                                          ("rerun", "--out /tmp/before"), ("regime", "the next session's queue")])
def test_lab_notebook_text_in_a_rendered_field_fails(field, text):
    summary = copy.deepcopy(SUMMARY)
    row = next(r for r in summary["rows"] if r["claim"] == "MaP_F > InD")
    if field == "rerun":
        row["rerun"] = list(row["rerun"]) + [text]
    else:
        row[field] = row[field] + " " + text
    assert any("reads like a lab notebook" in p for p in cs.check(summary))


@pytest.mark.parametrize("content, message", [
    ("", "the file is empty"),
    ("rows: [\n", "not valid YAML"),
    ("- a\n- b\n", "top level must be a mapping"),
    ("papers: {a: 1}\nverdicts: {x: y}\nrows: [1]\n", "papers.a must be a mapping"),
    ("papers: {a: {name: A, title: T, about: B}}\nverdicts: {x: y}\nrows: [1]\n", "rows[0] must be a mapping"),
    ("papers: {a: {name: A, title: T, about: B}}\nverdicts: {x: y}\nrows: [{claim: c, paper: a, verdict: x, "
     "regime: r, short: {claim: c, ours: 1}, full: {claim: c, ours: o, verdict: v}, rerun: [x]}]\n",
     "rows[0] ('c').short must be a mapping with claim, ours and verdict texts"),
])
def test_a_malformed_summary_is_one_line_and_exit_2(tmp_path, capsys, content, message):
    path = tmp_path / "summary.yaml"
    path.write_text(content, encoding="utf-8")
    assert cs.main(["--summary", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err and str(path) in err


def test_a_page_that_never_ends_or_is_not_text_is_one_line(tmp_path, capsys):
    assert cs.main(["--page", "/dev/zero"]) == 2
    assert "is a device" in capsys.readouterr().err
    bad = tmp_path / "page.md"
    bad.write_bytes(b"\xff\xfe not utf-8")
    assert cs.main(["--page", str(bad)]) == 2
    assert "not UTF-8" in capsys.readouterr().err

"""SQuAD / MRQA readers: valid files, one test per kind of malformed record, the real SQuAD data.

The fixtures in tests/fixtures/bad_qa are small valid files; each malformed case corrupts one record
of a copy written to tmp_path, then checks the error names the file and the record, and that
`on_bad_record="skip"` reads the rest and accounts for the drop.
"""
from __future__ import annotations

import copy
import gzip
import json
import re
from pathlib import Path

import pytest

from posbias.qa.mrqa import read_mrqa
from posbias.qa.readers import read_qa
from posbias.qa.squad import read_squad, read_squad_many
from posbias.errors import DataError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "bad_qa"
from helpers import SHARED_DATA as SHARED
V1 = json.loads((FIXTURES / "v1.json").read_text(encoding="utf-8"))
N_V1 = 5  # questions in v1.json


def write_json(tmp_path, obj, name="data.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(obj), encoding="utf-8")
    return path


def prefix(path) -> str:
    """Regex for the start of a DataError message about `path`."""
    return f"^{re.escape(str(path))}: "


def question(data, qid):
    return next(q for a in data["data"] for p in a["paragraphs"] for q in p["qas"] if q["id"] == qid)


# --- valid files ---------------------------------------------------------------------------------

def test_v1_reads_every_question_with_exact_offsets():
    ds = read_squad(FIXTURES / "v1.json")
    assert (ds.format, ds.version, ds.skipped) == ("squad", "1.1", [])
    assert [e.id for e in ds.examples] == ["a-0", "a-1", "a-2", "a-3", "b-0"]
    for e in ds.examples:
        assert all(e.context[a.start:a.end] == a.text for a in e.answers)
    a2, b0 = ds.examples[2], ds.examples[4]
    assert a2.question.endswith("? ")  # questions are not stripped here
    assert b0.context.startswith("  ") and b0.context.endswith("\n")  # nor contexts
    assert b0.answers[0].start == b0.context.index("Kepler", 3)  # the second "Kepler"
    assert (b0.title, ds.examples[0].gold_texts()) == ("Beta", ["Alpha Centauri"] * 2)


def test_v2_impossible_question_has_no_answers():
    ds = read_squad(FIXTURES / "v2.json")
    assert ds.version == "2.0"  # "v2.0" normalised
    possible, impossible = ds.examples
    assert not possible.is_impossible and possible.answers[0].text == "1990"
    assert impossible.is_impossible and impossible.answers == [] and impossible.gold_texts() == []
    assert impossible.meta == {}  # plausible_answers ignored
    assert ds.has_impossible


@pytest.mark.parametrize("name", ["v1.json.gz", "v1.json"])  # gzip found by magic bytes, not suffix
def test_gzip_input(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(gzip.compress((FIXTURES / "v1.json").read_bytes()))
    expected = [e.id for e in read_squad(FIXTURES / "v1.json").examples]
    assert [e.id for e in read_squad(path).examples] == expected
    assert read_qa(path).format == "squad"


def test_extra_question_keys_go_to_meta(tmp_path):
    data = copy.deepcopy(V1)
    question(data, "a-0")["answer_start_ambiguous"] = True
    ex = read_squad(write_json(tmp_path, data)).examples[0]
    assert ex.meta == {"answer_start_ambiguous": True}


def test_read_squad_many_concatenates_shards_and_checks_ids_across_them(tmp_path):
    first, second = copy.deepcopy(V1), copy.deepcopy(V1)
    first["data"], second["data"] = V1["data"][:1], V1["data"][1:]
    paths = [write_json(tmp_path, first, "p1.json"), write_json(tmp_path, second, "p2.json")]
    ds = read_squad_many(paths)
    assert [e.id for e in ds.examples] == [e.id for e in read_squad(FIXTURES / "v1.json").examples]
    with pytest.raises(DataError, match=r"p2\.json: record 'a-0': duplicate id .*p1\.json"):
        read_squad_many([paths[0], write_json(tmp_path, first, "p2.json")])


def test_mrqa_jsonl_and_gzip(tmp_path):
    gz = tmp_path / "mrqa.jsonl.gz"
    gz.write_bytes(gzip.compress((FIXTURES / "mrqa.jsonl").read_bytes()))
    for path in (FIXTURES / "mrqa.jsonl", gz):
        for ds in (read_mrqa(path), read_qa(path)):
            assert (ds.format, ds.version, ds.skipped) == ("mrqa", "SQuAD", [])
            q1, q2, q3 = ds.examples
            # The detected text is "denver  broncos": the Answer takes the context's own span text.
            assert q1.answers[0].text == "Denver Broncos" and q1.answers[0].start == 0
            assert q1.gold_texts() == ["Denver Broncos", "the Denver Broncos"]
            assert q1.meta == {"context_id": "ctx-1", "source_id": "56be4db0acb8001400a502ec"}
            assert [a.text for a in q3.answers] == ["10th and 11th centuries",
                                                    "in the 10th and 11th centuries"]
            assert all(e.context[a.start:a.end] == a.text for e in ds.examples for a in e.answers)


def test_on_bad_record_must_be_error_or_skip():
    with pytest.raises(ValueError, match="'error', 'skip'"):
        read_squad(FIXTURES / "v1.json", on_bad_record="warn")
    with pytest.raises(ValueError, match="'error', 'skip'"):
        read_mrqa(FIXTURES / "mrqa.jsonl", on_bad_record="ignore")


def test_check_offsets_false_accepts_misplaced_text(tmp_path):
    data = copy.deepcopy(V1)
    question(data, "a-0")["answers"][0]["answer_start"] = 1
    path = write_json(tmp_path, data)
    with pytest.raises(DataError, match="is not at answer_start 1"):
        read_squad(path)
    assert len(read_squad(path, check_offsets=False).examples) == N_V1


# --- malformed SQuAD records ---------------------------------------------------------------------

def _set(qid, key, value):
    return lambda d: question(d, qid).__setitem__(key, value)


def _set_answer(qid, key, value):
    return lambda d: question(d, qid)["answers"][0].__setitem__(key, value)


BAD_SQUAD = {
    # case: (corrupt the data in place, records skipped, words of the reason)
    "missing id": (lambda d: question(d, "a-1").pop("id"),
                   ["article 'Alpha' paragraph 0 question 1"], "id must be a non-empty string"),
    "duplicate id": (_set("a-3", "id", "a-2"), ["a-2"], "duplicate id"),
    "empty question": (_set("a-1", "question", " \t"), ["a-1"], "question must be a non-empty string"),
    "whitespace-only context": (lambda d: d["data"][0]["paragraphs"][1].__setitem__("context", " \n "),
                                ["a-2", "a-3"], "article 'Alpha' paragraph 1: context must be"),
    "paragraph without context": (lambda d: d["data"][0]["paragraphs"][1].pop("context"),
                                  ["a-2", "a-3"], "article 'Alpha' paragraph 1: context must be"),
    "non-string text": (_set_answer("a-1", "text", 4.37), ["a-1"], "text must be a non-empty string"),
    "answer_start out of range": (_set_answer("a-1", "answer_start", 200),
                                  ["a-1"], "answer_start must be an int in [0, 82)"),
    "text not at answer_start": (_set_answer("a-1", "answer_start", 40),
                                 ["a-1"], "is not at answer_start 40"),
    "bool answer_start": (_set_answer("a-0", "answer_start", False),
                          ["a-0"], "answer_start must be an int"),
    "v1 question without answers": (_set("b-0", "answers", []),
                                    ["b-0"], "answerable question has no answers"),
    "non-bool is_impossible": (_set("b-0", "is_impossible", "no"),
                               ["b-0"], "is_impossible must be true or false"),
}


@pytest.mark.parametrize("case", BAD_SQUAD)
def test_bad_squad_record(tmp_path, case):
    corrupt, records, reason = BAD_SQUAD[case]
    data = copy.deepcopy(V1)
    corrupt(data)
    path = write_json(tmp_path, data)
    with pytest.raises(DataError) as err:
        read_squad(path)
    assert str(err.value).startswith(f"{path}: record {records[0]!r}: ")
    assert reason in str(err.value)

    ds = read_squad(path, on_bad_record="skip")
    assert len(ds.examples) == N_V1 - len(records)
    assert [record for record, _ in ds.skipped] == records
    assert all(reason in why for _, why in ds.skipped)


def test_bad_paragraph_without_questions_is_named_by_position(tmp_path):
    data = copy.deepcopy(V1)
    data["data"][1]["paragraphs"][0] = {"qas": []}
    path = write_json(tmp_path, data)
    with pytest.raises(DataError, match="record \"article 'Beta' paragraph 0\": context must be"):
        read_squad(path)
    ds = read_squad(path, on_bad_record="skip")
    assert len(ds.examples) == N_V1 - 1 and [r for r, _ in ds.skipped] == ["article 'Beta' paragraph 0"]


def test_bad_utf8_names_the_byte_offset(tmp_path):
    raw = (FIXTURES / "v1.json").read_bytes()
    offset = raw.index(b"Alpha Centauri")
    path = tmp_path / "bad.json"
    path.write_bytes(raw[:offset] + b"\xff" + raw[offset + 1:])
    for on_bad_record in ("error", "skip"):  # a file-level error: never skipped
        expected = prefix(path) + rf"invalid UTF-8 at byte {offset} \(line \d+\)$"
        with pytest.raises(DataError, match=expected):
            read_squad(path, on_bad_record=on_bad_record)
    path.write_bytes(gzip.compress(raw[:offset] + b"\xff" + raw[offset + 1:]))
    with pytest.raises(DataError, match=rf"invalid UTF-8 at byte {offset} of the gunzipped data"):
        read_qa(path)


@pytest.mark.parametrize("text, reason", [
    ((FIXTURES / "v1.json").read_text(encoding="utf-8")[:500],
     r"not valid JSON: .* at line \d+ column \d+"),
    (json.dumps(V1["data"]), 'top level must be a JSON object with a "data" list'),
], ids=["truncated JSON", "top-level list"])
def test_file_level_errors_always_raise(tmp_path, text, reason):
    path = tmp_path / "data.json"
    path.write_text(text, encoding="utf-8")
    for on_bad_record in ("error", "skip"):
        with pytest.raises(DataError, match=prefix(path) + reason):
            read_squad(path, on_bad_record=on_bad_record)


def test_corrupt_gzip_and_missing_file_raise_data_error(tmp_path):
    path = tmp_path / "cut.json.gz"
    path.write_bytes(gzip.compress((FIXTURES / "v1.json").read_bytes())[:100])
    with pytest.raises(DataError, match="corrupt gzip data"):
        read_squad(path)
    with pytest.raises(DataError, match="cannot read file"):
        read_squad(tmp_path / "absent.json")


# --- malformed MRQA records ----------------------------------------------------------------------

def mrqa_lines() -> list[str]:
    return (FIXTURES / "mrqa.jsonl").read_text(encoding="utf-8").splitlines()


def test_mrqa_line_that_is_not_json(tmp_path):
    lines = mrqa_lines()
    lines[1] = lines[1][:-30]  # line 2 (the first context) cut short
    path = tmp_path / "cut.jsonl"
    path.write_text("\n".join(lines), encoding="utf-8")
    expected = prefix(path) + r"record 'line 2': not valid JSON: .* at column \d+$"
    with pytest.raises(DataError, match=expected):
        read_mrqa(path)
    ds = read_mrqa(path, on_bad_record="skip")
    assert [e.id for e in ds.examples] == ["q3"]
    assert [record for record, _ in ds.skipped] == ["line 2"]


def test_mrqa_question_without_detected_answers(tmp_path):
    lines = mrqa_lines()
    context = json.loads(lines[1])
    context["qas"][1]["detected_answers"] = []
    lines[1] = json.dumps(context)
    path = tmp_path / "none.jsonl"
    path.write_text("\n".join(lines), encoding="utf-8")
    expected = prefix(path) + r"record 'q2': line 2: no detected answer span$"
    with pytest.raises(DataError, match=expected):
        read_mrqa(path)
    ds = read_mrqa(path, on_bad_record="skip")
    assert [e.id for e in ds.examples] == ["q1", "q3"]
    assert ds.skipped == [("q2", "line 2: no detected answer span")]


def test_mrqa_span_outside_context(tmp_path):
    lines = mrqa_lines()
    context = json.loads(lines[2])
    context["qas"][0]["detected_answers"][1]["char_spans"] = [[80, 500]]
    lines[2] = json.dumps(context)
    path = tmp_path / "out.jsonl"
    path.write_text("\n".join(lines), encoding="utf-8")
    expected = prefix(path) + r"record 'q3': line 3: char span \[80, 500\] is outside"
    with pytest.raises(DataError, match=expected):
        read_mrqa(path)
    assert [e.id for e in read_mrqa(path, on_bad_record="skip").examples] == ["q1", "q2"]


# --- the real SQuAD data -------------------------------------------------------------------------

def test_official_squad_v11_dev():
    path = SHARED / "squad_v1.1" / "dev-v1.1.json.gz"
    if not path.exists():
        pytest.skip(f"{path} absent")
    ds = read_qa(path)
    assert (ds.format, ds.version, len(ds.examples), ds.skipped) == ("squad", "1.1", 10_570, [])
    assert len({e.title for e in ds.examples}) == 48
    assert sum(len(e.answers) for e in ds.examples) == 34_726


def test_rebuilt_squad_v11_train_shards():
    folder = SHARED / "squad_v1.1_train_reconstructed"
    paths = [folder / f"train-v1.1-reconstructed.part{i}of3.json.gz" for i in (1, 2, 3)]
    if not all(p.exists() for p in paths):
        pytest.skip(f"{folder} incomplete")
    ds = read_squad_many(paths)
    assert (len(ds.examples), ds.skipped) == (87_599, [])
    assert ds.version == "1.1-reconstructed-from-SQuAD-explorer-html"
    assert sum(e.meta["answer_start_ambiguous"] for e in ds.examples) == 9_438
    assert ds.examples[0].id == "squadexp-train-000-000-00"

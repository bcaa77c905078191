"""Atomic result files: complete or absent, and readable like any file the user writes."""
import os

import pytest

from posbias.utils import atomic_write_json, atomic_write_text


def test_atomic_files_get_the_usual_permissions(tmp_path):
    mask = os.umask(0o022)
    os.umask(mask)
    atomic_write_json(tmp_path / "a" / "m.json", {"f1": 1.0})
    assert (os.stat(tmp_path / "a" / "m.json").st_mode & 0o777) == 0o666 & ~mask


def test_a_failed_write_leaves_no_file(tmp_path):
    with pytest.raises(TypeError):
        atomic_write_text(tmp_path / "x.txt", object())  # not text: the write fails
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("indent", [None, 0, 2])
def test_json_files_are_written_as_json_dumps_writes_them(tmp_path, indent):
    """atomic_write_json streams a dict item by item: the text must still equal json.dumps's."""
    import json

    objs = [{"q1": [{"text": "é\n\"x", "p": 0.5, "s": -0.0}], "q\n2": [], "q3": {"a": {}, "b": [[], None]}},
            {}, [], "s", 1.5, {"1": {"nested": [1, {"x": True}]}}, {"nan": float("nan")}]
    for obj in objs:
        atomic_write_json(tmp_path / "o.json", obj, indent=indent)
        assert (tmp_path / "o.json").read_text(encoding="utf-8") == json.dumps(obj, indent=indent, ensure_ascii=False) + "\n"


def test_a_value_json_cannot_write_leaves_no_file(tmp_path):
    with pytest.raises(TypeError):
        atomic_write_json(tmp_path / "x.json", {"a": 1, "b": object()})
    assert not any(tmp_path.iterdir())

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

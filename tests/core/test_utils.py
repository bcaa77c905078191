"""Atomic result files: complete or absent, and readable like any file the user writes; the git state
run records carry."""
import os
import shutil
import subprocess

import pytest

from posbias.utils import atomic_write_json, atomic_write_text, git_state


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
    """atomic_write_json streams a dict item by item: the text must still equal json.dumps's (with
    NaN as null, `finite_or_none`: JSON has no NaN)."""
    import json

    from posbias.utils import finite_or_none

    objs = [{"q1": [{"text": "é\n\"x", "p": 0.5, "s": -0.0}], "q\n2": [], "q3": {"a": {}, "b": [[], None]}},
            {}, [], "s", 1.5, {"1": {"nested": [1, {"x": True}]}}, {"nan": float("nan")}]
    for obj in objs:
        atomic_write_json(tmp_path / "o.json", obj, indent=indent)
        expected = json.dumps(finite_or_none(obj), indent=indent, ensure_ascii=False) + "\n"
        assert (tmp_path / "o.json").read_text(encoding="utf-8") == expected


def test_a_value_json_cannot_write_leaves_no_file(tmp_path):
    with pytest.raises(TypeError):
        atomic_write_json(tmp_path / "x.json", {"a": 1, "b": object()})
    assert not any(tmp_path.iterdir())


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                   capture_output=True)


@pytest.fixture
def repo(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    r = tmp_path / "checkout"
    r.mkdir()
    _git(r, "init", "-q")
    (r / "a.py").write_text("x = 1\n")
    _git(r, "add", "a.py")
    _git(r, "commit", "-q", "-m", "one")
    return r


def test_git_state_names_the_commit_and_whether_tracked_files_changed(repo):
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert git_state(repo) == {"git_commit": head, "git_dirty": False}
    (repo / "new.txt").write_text("untracked files are not a change to the code\n")
    assert git_state(repo)["git_dirty"] is False
    (repo / "a.py").write_text("x = 2\n")
    assert git_state(repo) == {"git_commit": head, "git_dirty": True}


def test_git_state_does_not_walk_up_to_an_enclosing_repository(repo):
    # A package installed into a virtualenv that sits inside the user's own checkout.
    site = repo / ".venv" / "site-packages"
    site.mkdir(parents=True)
    assert git_state(site) == {}


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown needs root")
def test_git_state_reads_a_checkout_owned_by_another_user(repo):
    # git refuses such a checkout ("dubious ownership") unless told it is safe: the commit went unrecorded.
    for root, dirs, files in os.walk(repo):
        for name in dirs + files:
            os.lchown(os.path.join(root, name), 4321, 4321)
    os.lchown(repo, 4321, 4321)
    plain = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                           env={**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"})
    assert plain.returncode != 0  # the failure this guards against
    assert len(git_state(repo)["git_commit"]) == 40


def test_versions_read_the_checkout_once_per_process(monkeypatch):
    # A grid's later runs in the same process run the code it loaded, whatever is committed meanwhile.
    import posbias.utils as utils
    heads = iter([{"git_commit": "a" * 40, "git_dirty": False}, {"git_commit": "b" * 40, "git_dirty": False}])
    monkeypatch.setattr(utils, "git_state", lambda repo: next(heads))
    utils._package_git_state.cache_clear()
    try:
        assert utils.versions()["git_commit"] == utils.versions()["git_commit"] == "a" * 40
    finally:
        utils._package_git_state.cache_clear()

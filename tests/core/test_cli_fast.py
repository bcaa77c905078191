"""The CLI answers before torch loads: `--help`, `--version`, an argument error and a mistake in a
config (a key, a preset, a data file, the output folder) are answered without importing torch or
transformers, so in about a second."""
from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers")


def run_main(argv: list[str], tmp_path) -> tuple[int, str, list[str]]:
    """`posbias.cli.main(argv)` in a fresh interpreter: (exit code, stderr, heavy modules loaded)."""
    code = ("import sys\nfrom posbias import cli\ntry:\n    rc = cli.main(sys.argv[1:])\nexcept SystemExit as e:\n"
            "    rc = e.code\nprint('LOADED', [m for m in %r if m in sys.modules], file=sys.stderr)\nsys.exit(rc)\n"
            % (HEAVY,))
    r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    lines = r.stderr.splitlines()
    loaded = eval(lines[-1].removeprefix("LOADED "))  # noqa: S307  (the list printed above)
    return r.returncode, "\n".join(lines[:-1]), loaded


@pytest.mark.parametrize("argv, message", [
    (["train", "qa", "-c", "tiny", "train.lrr=1"], "unknown config key train.lrr; did you mean train.lr?"),
    (["train", "tagging", "-c", "tiny_tagging", "data.max_seq_lenn=8"], "did you mean data.max_seq_len?"),
    (["train", "qa", "-c", "tny"], "config 'tny' is neither a file nor a preset; did you mean 'tiny'?"),
    (["train", "qa", "-c", "tiny", "data.train_file=no_such.json"], "no_such.json: cannot read file"),
    (["train", "qa", "-c", "tiny", "train.output_dir=a_file"], "train.output_dir a_file is an existing file"),
    (["train", "qa", "-c", "tiny", "train.max_steps=0"], "train.max_steps must be >= 1"),
    (["train", "qa"], "the following arguments are required: -c/--config"),
    (["diagnose", "tagging", "--model", "m", "--data", "d", "--output-dir", "o", "--k-max", "0"], "--k-max"),
])
def test_a_mistake_is_one_line_and_exit_2_without_torch(argv, message, tmp_path):
    (tmp_path / "a_file").write_text("", encoding="utf-8")
    code, err, loaded = run_main(argv, tmp_path)
    assert code == 2, err
    assert [line for line in err.splitlines() if "error:" in line] == [err.splitlines()[-1]], err
    assert message in err and "Traceback" not in err
    assert loaded == []


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["train", "--help"], ["diagnose", "qa", "--help"]])
def test_help_and_version_load_no_torch(argv, tmp_path):
    code, err, loaded = run_main(argv, tmp_path)
    assert code == 0, err
    assert loaded == []


def test_version_names_the_package():
    from posbias import __version__

    r = subprocess.run([sys.executable, "-m", "posbias", "--version"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == f"posbias {__version__}"


def test_importing_posbias_loads_no_torch_and_keeps_its_api():
    code = ("import sys, posbias; from posbias import train, evaluate, predict, diagnose, score, export; "
            "import posbias.cli, posbias.config, posbias.api; "
            "print([m for m in %r if m in sys.modules], sorted(posbias.__all__))" % (HEAVY,))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("[] [")

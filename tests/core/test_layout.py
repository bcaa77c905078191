"""The folders around the package use its public API only: no file under benchmarks/, reproductions/,
tools/ or examples/ imports a private name of posbias (a module or name with a leading underscore)
or reaches one through an imported name (`posbias.config._YAMLLoader`); and the old bench/ folder
holds no tracked file (its data build folder, bench/out/, is git-ignored)."""
from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT_FOLDERS = ("benchmarks", "reproductions", "tools", "examples")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(source: str) -> list[tuple[int, str]]:
    """(line, what) for every private name of posbias the source imports or reaches through a name
    bound by an import of posbias."""
    tree = ast.parse(source)
    bound: set[str] = set()  # local names bound to posbias modules or objects
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "posbias" or a.name.startswith("posbias."):
                    if any(_private(p) for p in a.name.split(".")):
                        found.append((node.lineno, a.name))
                    bound.add(a.asname or a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                node.module == "posbias" or node.module.startswith("posbias.")):
            if any(_private(p) for p in node.module.split(".")):
                found.append((node.lineno, node.module))
            for a in node.names:
                if _private(a.name):
                    found.append((node.lineno, f"{node.module}.{a.name}"))
                bound.add(a.asname or a.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in bound:
                found.append((node.lineno, f"{ast.unparse(node.value)}.{node.attr}"))
    return sorted(found)


def test_the_check_finds_private_imports():
    """A deliberately wrong file is caught three ways; public use passes."""
    bad = ("from posbias.training import _adamw\nimport posbias.experiment.spec as s\nfrom posbias import config\n"
           "x = s._run_name\ny = config._YAMLLoader\nfrom posbias._private import thing\n")
    assert [what for _, what in private_uses(bad)] == ["posbias.training._adamw", "s._run_name",
                                                       "config._YAMLLoader", "posbias._private"]
    good = "from posbias.experiment import run_name\nimport os\nx = os._exit\nclass A:\n    _y = 1\n"
    assert private_uses(good) == []


@pytest.mark.parametrize("folder", SCRIPT_FOLDERS)
def test_scripts_use_only_public_names_of_posbias(folder):
    files = sorted((ROOT / folder).rglob("*.py"))
    bad = {str(p.relative_to(ROOT)): private_uses(p.read_text(encoding="utf-8")) for p in files}
    assert {k: v for k, v in bad.items() if v} == {}


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout")
def test_bench_folder_holds_no_tracked_file():
    r = subprocess.run(["git", "ls-files", "bench"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert r.stdout.split() == []

"""A diagnosis owns its dispatch: a plug-in diagnosis, registered in `posbias.registry.DIAGNOSES` from
outside the package (a `posbias.plugins` entry point), runs end to end from the CLI and from Python with
no edit of posbias; the fronts name no diagnosis, and no diagnosis package imports another."""
from __future__ import annotations

import ast
import json
import os
import sys
from pathlib import Path

import pytest

import posbias
from posbias import registry

from helpers import run_cli

PACKAGE = Path(posbias.__file__).parent
PLUGIN = '''"""A posbias plug-in: the `count` diagnosis (the questions of a SQuAD file by answer position)."""
import json
from pathlib import Path

from posbias.diagnoses import answerable, run
from posbias.qa.readers import read_dataset
from posbias.registry import DIAGNOSES


def count(model, data, output_dir, *, bias_samples, min_bucket, quality_floor, progress, halves=2):
    examples = answerable(read_dataset(data).examples)
    front = sum(e.answers[0].start < len(e.context) / halves for e in examples)
    res = {"model": model, "questions": len(examples), "front": front, "bootstrap_samples": bias_samples,
           "verdict_lines": [f"{front} of {len(examples)} answers in the front part ({model})"]}
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    (Path(output_dir) / "diagnosis.json").write_text(json.dumps(res))
    return res


class CountDiagnosis:
    name = "count"
    cli_help = "count answers by position (a toy plug-in)"
    cli_commands = ("diagnose",)

    def add_cli_arguments(self, command, p):
        p.add_argument("--model", required=True)
        p.add_argument("--data", required=True)
        p.add_argument("--output-dir", required=True)
        p.add_argument("--halves", type=int, default=2)
        p.add_argument("--bootstrap-samples", type=int, default=100)
        p.add_argument("--min-bucket", type=int, default=30)
        p.add_argument("--quality-floor", type=float, default=20.0)
        p.add_argument("--verbose", action="store_true")
        p.set_defaults(task_options=("halves",), none_means=())

    def diagnose(self, model, data, output_dir, *, progress=True, bootstrap_samples=2000, min_bucket=30,
                 quality_floor=20.0, **options):
        return run(count, model, data, output_dir, progress=progress, bootstrap_samples=bootstrap_samples,
                   min_bucket=min_bucket, quality_floor=quality_floor, **options)


DIAGNOSES.register("count")(CountDiagnosis())
'''


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("diagnosis_plugin")
    (d / "posbias_count_plugin.py").write_text(PLUGIN, encoding="utf-8")
    info = d / "posbias_count_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: posbias-count-plugin\nVersion: 0.1\n", encoding="utf-8")
    (info / "entry_points.txt").write_text("[posbias.plugins]\ncount = posbias_count_plugin\n", encoding="utf-8")
    return d


def test_a_plugin_diagnosis_runs_from_the_cli_and_from_python(plugin_dir, tmp_path, monkeypatch):
    env = {"PYTHONPATH": os.pathsep.join([str(plugin_dir), os.environ.get("PYTHONPATH", "")])}
    r = run_cli("diagnose", "count", "--model", "m1", "--data", "demo:dev", "--output-dir", str(tmp_path / "cli"),
                "--halves", "3", env=env)
    assert r.returncode == 0, r.stderr
    assert "answers in the front part (m1)" in r.stdout
    assert json.loads((tmp_path / "cli" / "diagnosis.json").read_text())["bootstrap_samples"] == 100
    assert "count" in run_cli("diagnose", "--help", env=env).stdout
    bad = run_cli("diagnose", "count", "--model", "m", "--data", "demo:dev", "--output-dir", str(tmp_path / "b"),
                  "--min-bucket", "0", env=env)
    assert bad.returncode == 2 and "min_bucket must be a positive integer" in bad.stderr  # the shared verdict check

    registry.DIAGNOSES.names()  # the built-in diagnoses loaded before the copies are taken
    monkeypatch.syspath_prepend(str(plugin_dir))
    monkeypatch.setitem(registry._plugins, "loaded", False)
    # `count` stays registered in this process no longer than this test: later tests list the diagnoses
    monkeypatch.setattr(registry.DIAGNOSES, "_table", dict(registry.DIAGNOSES._table))
    monkeypatch.setattr(registry.DIAGNOSES, "_traits", dict(registry.DIAGNOSES._traits))
    monkeypatch.delitem(sys.modules, "posbias_count_plugin", raising=False)
    registry.load_plugins()
    res = posbias.diagnose("m2", "demo:dev", tmp_path / "py", task="count", halves=2, bootstrap_samples=7)
    assert res["model"] == "m2" and res["bootstrap_samples"] == 7 and 0 < res["front"] < res["questions"]


def _imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            out += [base] + [f"{base}.{a.name}" if node.module is None else base for a in node.names]
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names]
    return out


def test_no_diagnosis_package_imports_another_and_the_fronts_name_none():
    diagnoses = [d for d in registry.DIAGNOSES.names() if (PACKAGE / d).is_dir()]
    assert set(diagnoses) >= {"retrieval", "generation"}
    for d in diagnoses:
        others = [o for o in diagnoses if o != d]
        for f in (PACKAGE / d).rglob("*.py"):
            for name in _imports(f):
                for o in others:
                    assert not (name.startswith(f"..{o}") or name.startswith(f"posbias.{o}")), (f, name)
    for front in ("api.py", "cli.py"):
        tree = ast.parse((PACKAGE / front).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and not isinstance(
                    getattr(node, "parent", None), ast.Expr):
                assert node.value not in diagnoses, (front, node.value, getattr(node, "lineno", None))
        assert not [n for n in _imports(PACKAGE / front) if any(f".{d}" in n for d in diagnoses)], front

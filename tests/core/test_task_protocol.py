"""The `posbias.tasks.Task` protocol: every registered task has every member, and the fronts reach
a task only through it (a task registered from outside is dispatched to without touching them)."""
import ast
from pathlib import Path

import pytest

import posbias
from posbias import tasks
from posbias.errors import ConfigError
from posbias.registry import TASKS

PACKAGE = Path(posbias.__file__).parent


@pytest.mark.parametrize("task", tasks.all_tasks(), ids=lambda t: t.name)
def test_every_registered_task_has_every_member_of_the_protocol(task):
    assert tasks.missing_members(task) == [] and isinstance(task, tasks.Task)
    for optional in ("position_eval_checkpoint", "position_metrics", "report_figures", "improvement_rows",
                     "report_sections"):
        value = getattr(task, optional)
        assert value is None or callable(value)


def test_a_task_lacking_a_member_is_named():
    class Partial:
        name = "partial"

    missing = tasks.missing_members(Partial())
    assert "build_model" in missing and "improvement_rows" in missing and "name" not in missing


def _task_name_comparisons(path: Path) -> list[str]:
    """`x == "qa"` / `"tagging" != y` in a module: dispatch by the task's name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                if isinstance(side, ast.Constant) and side.value in TASKS.names():
                    found.append(f"{path.name}:{node.lineno}")
    return found


def test_the_fronts_do_not_dispatch_by_task_name():
    assert _task_name_comparisons(PACKAGE / "api.py") == []
    assert _task_name_comparisons(PACKAGE / "cli.py") == []


class EchoTask:
    """A third task, registered from outside: the API's evaluate, predict, score, diagnose and export
    reach it through the protocol."""

    name = "echo_test_task"
    hf_suffix = "ForEchoTest"

    def __init__(self):
        self.calls = []

    def __getattr__(self, member):
        if member.startswith("__"):
            raise AttributeError(member)

        def record(*args, **kwargs):
            self.calls.append((member, args, kwargs))
            return {"member": member}
        return record


def test_the_api_reaches_a_new_task_through_the_protocol(monkeypatch, tmp_path):
    task = EchoTask()
    task.predict_inputs = ("text",)
    monkeypatch.setitem(TASKS._table, task.name, task)  # registered for this test only
    monkeypatch.setattr(tasks, "_checkpoint_task_name", lambda model: task.name)
    assert posbias.evaluate("m", "d.txt") == {"member": "evaluate_checkpoint"}
    assert posbias.predict("m", text="a b") == {"member": "predict_checkpoint"}
    assert task.calls[-1][2]["text"] == "a b"
    with pytest.raises(ConfigError, match=r"^a echo_test_task model predicts from --text or --data; --question"):
        posbias.predict("m", question="q", context="c")
    assert posbias.diagnose("m", "d.txt", tmp_path, k=3) == {"member": "diagnose"}
    assert task.calls[-1][2]["k"] == 3 and task.calls[-1][2]["bias_samples"] == 2000
    assert posbias.score("d.txt", __file__, task=task.name, flavour=1) == {"member": "score_files"}
    with pytest.raises(ConfigError, match="is a echo_test_task model, not a qa one"):
        posbias.evaluate("m", "d.txt", task="qa")


def test_the_cli_names_no_task():
    """The CLI's task sub-commands come from the registries (`Task.add_cli_arguments`): cli.py holds
    no task's name and imports no task package, so a plug-in task gets `posbias train NAME` too."""
    from posbias.registry import DIAGNOSES

    tree = ast.parse((PACKAGE / "cli.py").read_text(encoding="utf-8"))
    names = set(TASKS.names()) | set(DIAGNOSES.names())
    named = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Constant) and node.value in names]
    imported = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                if (node.module or "").split(".")[0] in names]
    assert named == [] and imported == []


def test_every_cli_entry_adds_its_arguments_without_torch():
    """Building the parser imports each task (and plug-in) and calls `add_cli_arguments`: a task's
    module must keep torch out of its top-level imports."""
    import subprocess
    import sys

    code = ("import sys; from posbias import cli; cli.build_parser(); "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"

"""The package's import graph has no circle: every `import` of a posbias module, at the top of a file
or inside a function, is an arrow, and no arrows loop. Data and control flow one way: the fronts
(api, cli, hf) call down; the task packages (qa, tagging) sit above the shared core (config,
checkpoint, encoders, ...), and the modules above the tasks (tasks, training,
the experiment package with its report) import them.

The one deliberate link that is not an import: the core finds a task by name in
`posbias.registry.TASKS`, whose built-in entries (`qa`, `tagging`) import their package on first use,
as a plug-in table of entry points would (the tasks load torch, which `import posbias` does without).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import posbias

PACKAGE = Path(posbias.__file__).resolve().parent


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = PACKAGE) -> dict[str, dict[str, int]]:
    """module -> {imported posbias module: first line}, from every import statement in its source.
    `from pkg import name` points at `pkg.name` when that is a module, else at `pkg`; an import of a
    module's parent package for it is not counted (Python runs that package's __init__, but the
    arrow the code draws is to the module)."""
    modules = {_module_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        arrows = graph.setdefault(name, {})
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                    base = f"{base}.{node.module}" if node.module else base
                else:
                    base = node.module or ""
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for target in targets:
                while target not in modules and "." in target:  # posbias.qa.heads.X -> the module holding X
                    target = target.rpartition(".")[0]
                if target in modules and target != name:
                    arrows.setdefault(target, node.lineno)
    return graph


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_package_has_no_import_circle():
    graph = import_graph()
    found = circles(graph)
    detail = [f"{a} -> {b} (line {line})" for c in found for a in c for b, line in graph[a].items() if b in c]
    assert not found, "import circles:\n" + "\n".join(detail)


def test_the_core_imports_no_task_package():
    graph = import_graph()
    for core in ("posbias.config", "posbias.compat", "posbias.checkpoint", "posbias.evaluation", "posbias.encoders",
                 "posbias.registry", "posbias.utils", "posbias.outputs", "posbias.analysis.report", "posbias.render"):
        assert not [m for m in graph[core] if m.startswith(("posbias.qa", "posbias.tagging", "posbias.tasks",
                                                             "posbias.experiment", "posbias.training"))], core


def test_a_planted_circle_is_found(tmp_path):
    # The check itself: two modules importing each other, one at the top, one inside a function.
    pkg = tmp_path / "posbias"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "core.py").write_text("from .sub.task import run\n")
    (pkg / "sub" / "task.py").write_text("def run():\n    from ..core import x\n")
    (pkg / "leaf.py").write_text("from . import core\n")
    assert circles(import_graph(pkg)) == [["posbias.core", "posbias.sub.task"]]


@pytest.mark.parametrize("module, loaded", [("posbias", "[]"), ("posbias.config", "[]"), ("posbias.compat", "[]"),
                                             ("posbias.checkpoint", "['torch']"), ("posbias.evaluation", "['torch']")])
def test_importing_the_core_loads_no_task(module, loaded):
    # `import posbias` and the CLI's argument errors stay fast: the tasks (and torch) load on first use.
    import subprocess
    import sys

    code = (f"import sys, {module}; "
            "print(sorted(m for m in sys.modules if m in ('torch', 'posbias.qa', 'posbias.tagging')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == loaded

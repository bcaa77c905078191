"""The Python API reference is rendered from docstrings: everything in `posbias.__all__` and the
public classes and functions of `posbias.hf` has a Google-style docstring with an Args section
naming each parameter it takes and a Returns section where it returns something."""
from __future__ import annotations

import ast
import inspect
import re
import textwrap

import pytest

from . import generator

SECTION = re.compile(r"^(Args|Arguments|Returns|Yields|Raises|Example|Examples|Note|Notes):\s*$")
ENTRY = re.compile(r"^\s+(\*{0,2}[A-Za-z_]\w*)\s*(?:\([^)]*\))?\s*:")


def sections(doc: str) -> dict[str, list[str]]:
    """{section title: its lines} of a Google-style docstring."""
    out, current = {}, None
    for line in inspect.cleandoc(doc).splitlines():
        m = SECTION.match(line)
        if m:
            current = out.setdefault(m.group(1).replace("Arguments", "Args"), [])
        elif current is not None and line and not line[0].isspace():
            current = None  # back at the docstring's own indentation: the section ended
        elif current is not None:
            current.append(line)
    return out


def documented_args(doc: str) -> set[str]:
    lines = sections(doc).get("Args", [])
    indent = min((len(x) - len(x.lstrip()) for x in lines if x.strip()), default=0)
    return {m.group(1) for x in lines if len(x) - len(x.lstrip()) == indent and (m := ENTRY.match(x))}


def parameters(fn) -> list[str]:
    """What a caller passes: every parameter but self, *args and **kwargs written as such."""
    out = []
    for name, p in inspect.signature(fn).parameters.items():
        if name in ("self", "cls"):
            continue
        out.append({p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "") + name)
    return out


def returns_value(fn) -> bool:
    """Whether `fn` returns something: an annotation other than None, else a `return <value>` of
    its own (not a nested function's)."""
    annotation = inspect.signature(fn).return_annotation
    if annotation is not inspect.Signature.empty:
        return annotation not in (None, "None")
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    body = tree.body[0]

    def walk(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                continue
            if isinstance(child, ast.Return) and child.value is not None and not (
                    isinstance(child.value, ast.Constant) and child.value.value is None):
                return True
            if walk(child):
                return True
        return False

    return walk(body)


def problems(fn, name: str, *, init_of=None) -> list[str]:
    """What the docstring of `fn` lacks (`init_of`: a class, whose docstring documents `fn`'s
    arguments, `__init__`'s)."""
    doc = inspect.getdoc(init_of if init_of is not None else fn)
    if not doc or not doc.strip():
        return [f"{name}: no docstring"]
    out = []
    missing = [p for p in parameters(fn) if p not in documented_args(doc) and p.lstrip("*") not in documented_args(doc)]
    if missing:
        out.append(f"{name}: Args does not document {missing}")
    if init_of is None and returns_value(fn) and not sections(doc).get("Returns"):
        out.append(f"{name}: no Returns section")
    return out


def overrides_a_base(cls, method: str) -> bool:
    return any(method in vars(base) for base in cls.__mro__[1:] if base is not object)


def public_objects():
    import posbias
    import posbias.hf

    gen = generator()
    for name in gen.public_api():
        yield f"posbias.{name}", getattr(posbias, name)
    for name in gen.public_hf():
        yield f"posbias.hf.{name}", getattr(posbias.hf, name)


def test_the_public_names_are_found():
    names = [n for n, _ in public_objects()]
    assert {"posbias.train", "posbias.diagnose", "posbias.hf.PositionShiftCollator",
            "posbias.hf.PositionBiasCallback"} <= set(names)


@pytest.mark.parametrize("qualname, obj", list(public_objects()), ids=lambda x: x if isinstance(x, str) else "")
def test_public_docstrings_have_args_and_returns(qualname, obj):
    found = []
    if inspect.isclass(obj):
        found += problems(obj.__init__, qualname, init_of=obj)
        for method, fn in vars(obj).items():
            if method.startswith("_") or not inspect.isfunction(fn) or overrides_a_base(obj, method):
                continue
            found += problems(fn, f"{qualname}.{method}")
    else:
        found += problems(obj, qualname)
    assert not found, "\n".join(found)


def test_the_docstring_check_catches_what_is_missing():
    def f(a, b=1, **options):
        """Do it.

        Args:
            a: the a.
                More on a.
            b (int): the b.
        """
        return a

    assert problems(f, "f") == ["f: Args does not document ['**options']", "f: no Returns section"]

    def g(a) -> None:
        """Do it.

        Args:
            a: the a.
        """

    assert problems(g, "g") == []

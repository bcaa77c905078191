"""Every key of every task's config refuses wrong-typed and out-of-range values with a ConfigError
naming the key (never a TypeError deep inside, never a silent coercion such as max_steps=2.5 -> 3).

The cases are generated from the dataclasses' annotations and their declared bounds (`bounded`), so a
key added later is covered without editing this file."""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Literal, Union, get_args, get_origin, get_type_hints

import pytest

from posbias.config import UNBOUNDED, Bound, _check_type, build_config, dotted_keys
from posbias.errors import ConfigError
from posbias.tasks import get_task
from helpers import tiny_config

TASKS = ("qa", "tagging")


def _members(tp) -> tuple:
    """The members of a union annotation (`int | None` or `Optional[int]`), else (tp,)."""
    return get_args(tp) if get_origin(tp) in (Union, types.UnionType) else (tp,)


def leaf_fields(cls, prefix: str = ""):
    """(dotted key, annotation, dataclass field) of every non-section key, nested sections included
    (also a section behind `X | None`, such as `train.debias`)."""
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp, key = hints[f.name], prefix + f.name
        sections = [m for m in _members(tp) if dataclasses.is_dataclass(m)]
        if sections:
            yield from leaf_fields(sections[0], key + ".")
        else:
            yield key, tp, f


def _accepts(tp, value) -> bool:
    """Whether `value`'s type is one the annotation names (not its range)."""
    for m in _members(tp):
        base = get_origin(m) or m
        if m is type(None) and value is None:
            return True
        if base is Literal and value in get_args(m):
            return True
        if base is bool and isinstance(value, bool):
            return True
        if isinstance(value, bool):
            continue
        if base is int and isinstance(value, int):
            return True
        if base is float and isinstance(value, (int, float)):
            return True
        if base in (str, list, dict) and isinstance(value, base):
            return True
    return False


WRONG = [True, 2.5, "abc", [1, 2], {"a": 1}, float("nan"), float("inf"), -float("inf"), 2**70, 3]


def wrong_values(tp, bound: Bound | None) -> list:
    """Values the annotation or the bound must refuse."""
    members = _members(tp)
    out = []
    for v in WRONG:
        if isinstance(v, float) and not math.isfinite(v):
            out.append(v)  # no key takes NaN or infinity: a float key refuses it, any other by type
        elif v == 2**70 and any((get_origin(m) or m) is int for m in members):
            out.append(v)  # past 64 bits
        elif not _accepts(tp, v):
            out.append(v)
    for m in members:  # a container of the wrong element type
        if get_origin(m) is list and get_args(m)[0] is not int:
            out.append([1])
        if get_origin(m) is dict and get_args(m):
            out.append({"a": 1})
    if bound is not None and bound != UNBOUNDED:
        numeric = [m for m in members if m in (int, float)]
        if numeric:
            step = 1 if numeric[0] is int else 0.5
            if bound.lo is not None:
                out.append(bound.lo if bound.lo_open else numeric[0](bound.lo - step))
            if bound.hi is not None:
                out.append(bound.hi if bound.hi_open else numeric[0](bound.hi + step))
        elif bound.lo == 1:  # a length: empty file lists and names
            out += [v for v in ("", []) if _accepts(tp, v)]
    return out


def base_config(task: str) -> dict:
    if task == "qa":
        return tiny_config()
    return {"task": "tagging", "model": {"name_or_path": None, "tokenizer": "tiny",
                                         "encoder": tiny_config()["model"]["encoder"]},
            "data": {"train_file": "demo:wnut-train", "eval_file": "demo:wnut-dev", "max_seq_len": 64, "stride": 16}}


def nested(key: str, value) -> dict:
    out: dict = {}
    cur = out
    parts = key.split(".")
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
    cur[parts[-1]] = value
    return out


def cases():
    for task in TASKS:
        for key, tp, f in leaf_fields(get_task(task).config_class):
            for v in wrong_values(tp, f.metadata.get("bound")):
                yield pytest.param(task, key, v, id=f"{task}:{key}={v!r}")
        for section in ("model", "data", "train"):
            for v in ("abc", 3, [1]):
                yield pytest.param(task, section, v, id=f"{task}:{section}={v!r}")


@pytest.mark.parametrize("task, key, value", list(cases()))
def test_every_key_refuses_wrong_types_and_out_of_range_values(task, key, value):
    with pytest.raises(ConfigError) as e:
        build_config(base_config(task), nested(key, value))
    assert str(e.value).startswith(key), str(e.value)  # the key first: `train.max_steps: expected ...`
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("task", TASKS)
def test_the_base_configs_and_every_default_pass(task):
    """The generator's base is valid, so each refusal above comes from the value under test."""
    build_config(base_config(task))
    for key, tp, f in leaf_fields(get_task(task).config_class):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        assert _accepts(tp, default) or dataclasses.is_dataclass(default), key
        _check_type(default, tp, key)


@pytest.mark.parametrize("task", TASKS)
def test_every_numeric_key_declares_its_range(task):
    """A new int or float key must state its range (`bounded(default, lo, hi)`; `bounded(default)`:
    any finite value), so the checks above cover it."""
    cls = get_task(task).config_class
    undeclared = [key for key, tp, f in leaf_fields(cls)
                  if any(m in (int, float) for m in _members(tp)) and "bound" not in f.metadata]
    assert undeclared == []
    leaves = {key for key, _, _ in leaf_fields(cls)}
    assert set(dotted_keys(cls)) - leaves <= {"model", "data", "train", "decode", "train.debias"}  # no key missed


@pytest.mark.parametrize("override, message", [
    ("train.max_steps=2.5", r"train.max_steps: expected int \| null, got 2.5"),
    ("train.max_steps=true", r"train.max_steps: expected int \| null, got True"),
    ("train.max_steps=abc", r"train.max_steps: expected int \| null, got 'abc'"),
    ("data.max_eval_examples=-1", r"data.max_eval_examples must be >= 1 \(or null\), got -1"),
    ("data.max_train_examples=-5", r"data.max_train_examples must be >= 1 \(or null\), got -5"),
    ("data.train_file=[]", "data.train_file must not be empty"),
    ("model.encoder.hidden_size=-32", r"model.encoder.hidden_size must be in \[1, 2\*\*20\], got -32"),
    ("model.encoder.num_attention_heads=0", r"model.encoder.num_attention_heads must be in \[1, 2\*\*20\]"),
    ("model.encoder.hidden_size=30", r"model.encoder.hidden_size \(30\) must be a multiple of "
                                     r"model.encoder.num_attention_heads \(4\)"),
    ("model.encoder.hidden_size=abc", "model.encoder.hidden_size: expected int, got 'abc'"),
    ("train.debias={method: entropy, entropy_weight: 1e300}", r"train.debias.entropy_weight must be in \[0, 1000000\]"),
    ("train.debias={method: entropy, entropy_weight: 1e9}", r"train.debias.entropy_weight must be in \[0, 1000000\]"),
    ("train.seed=-1", r"train.seed must be in \[0, 2\*\*32\), got -1"),
    ("train.warmup_ratio=1", r"train.warmup_ratio must be in \[0, 1\), got 1.0"),
    ("train.report_to=[1]", r"train.report_to\[0\]: expected str, got 1"),
])
def test_the_reported_cases_name_the_key_and_the_range(override, message):
    """The cases of the adversarial run, as YAML overrides (YAML reads 1e300 as a string)."""
    with pytest.raises(ConfigError, match=message):
        build_config(tiny_config(), [override])


def test_a_union_and_a_literal_are_checked_in_either_spelling():
    """`Optional[int]` (typing.Union) and `int | None` (types.UnionType) alike; `Literal` as a choice."""
    for tp in (typing.Optional[int], int | None):
        assert _check_type(None, tp, "k") is None and _check_type(3, tp, "k") == 3
        for bad in (2.5, True, "abc"):
            with pytest.raises(ConfigError, match="^k: expected int | null"):
                _check_type(bad, tp, "k")
    assert _check_type("a", Literal["a", "b"], "k") == "a"
    with pytest.raises(ConfigError, match=r"k must be one of \['a', 'b'\], got 'c'"):
        _check_type("c", Literal["a", "b"], "k")
    with pytest.raises(ConfigError, match=r"k\.x: expected str, got 1"):
        _check_type({"x": 1}, dict[str, str], "k")

"""Typed values from plain mappings: a value checked against its annotation, dataclasses built from
mappings, ranges declared beside fields; each error a one-line ConfigError naming the dotted key.

Below `config.py` (which builds run configs with it) and `factories.py` (which checks the keyword
options of registered heads and perturbations with it). `typing.Annotated[int, Bound(1)]` carries a
range on an annotation, as `bounded(...)` does on a dataclass field.
"""
from __future__ import annotations

import dataclasses
import math
import types
from dataclasses import dataclass, field
from typing import Annotated, Literal, Union, get_args, get_origin, get_type_hints

from .compat import marks
from .errors import ConfigError, did_you_mean


@dataclass(frozen=True)
class Bound:
    """The allowed range of a config value, declared beside its field (`bounded`) and checked where
    every value is checked (`_from_dict`), so that no key relies on a hand-written `if` in `validate`.
    For a string or list value the bound applies to its length (`data.train_file: []`)."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    what: str | None = None  # how a message names the range (`a non-negative integer`); default `>= 0`

    def contains(self, x) -> bool:
        return ((self.lo is None or (x > self.lo if self.lo_open else x >= self.lo))
                and (self.hi is None or (x < self.hi if self.hi_open else x <= self.hi)))

    def __str__(self) -> str:
        if self.what:
            return self.what
        if self.hi is None:
            return f"{'>' if self.lo_open else '>='} {_num(self.lo)}"
        if self.lo is None:
            return f"{'<' if self.hi_open else '<='} {_num(self.hi)}"
        return f"in {'(' if self.lo_open else '['}{_num(self.lo)}, {_num(self.hi)}{')' if self.hi_open else ']'}"


UNBOUNDED = Bound()


def _num(x) -> str:
    """2**32 rather than 4294967296 in messages."""
    if isinstance(x, int) and x >= 2**16 and x & (x - 1) == 0:
        return f"2**{x.bit_length() - 1}"
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e16:
        return str(int(x))
    return f"{x:g}" if isinstance(x, float) else str(x)


def bounded(default=dataclasses.MISSING, lo=None, hi=None, *, lo_open: bool = False, hi_open: bool = False,
            default_factory=dataclasses.MISSING, **compat_marks):
    """A dataclass field with its allowed range (see `Bound`); `bounded(16, 1)`: default 16, >= 1.
    Every int and float field of a config declares one (`UNBOUNDED` = any finite value): a test
    walks the fields and fails on a numeric field without it. `compat_marks`: the field's
    compatibility rules (`posbias.compat.marks`: hash=False, neutral=..., resumable=True)."""
    return field(default=default, default_factory=default_factory,
                 metadata={"bound": Bound(lo, hi, lo_open, hi_open), **marks(**compat_marks)})


def check_bound(value, bound: Bound | None, key: str, *, nullable: bool = False) -> None:
    """Raise ConfigError naming `key` and the range when `value` lies outside `bound`."""
    if bound is None or value is None or bound == UNBOUNDED:
        return
    if isinstance(value, (str, list, dict)):
        if not bound.contains(len(value)):
            what = "must not be empty" if bound.lo == 1 and bound.hi is None else f"must have a length {bound}"
            raise ConfigError(f"{key} {what}, got {value!r}")
        return
    if not bound.contains(value):
        raise ConfigError(f"{key} must be {bound}{' (or null)' if nullable else ''}, got {value!r}")


INT64 = 2**63  # torch and NumPy hold integers in 64 bits: a larger one would fail deep inside them


def _type_name(tp) -> str:
    """`int | None`, `list[str]`, `one of ['a', 'b']`: an annotation as a message shows it."""
    origin = get_origin(tp)
    if origin is Annotated:
        return _type_name(get_args(tp)[0])
    if origin is Union or origin is types.UnionType:
        return " | ".join(_type_name(a) for a in get_args(tp))
    if origin is Literal:
        return f"one of {list(get_args(tp))}"
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in get_args(tp))}]"
    if tp is type(None):
        return "null"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return getattr(tp, "__name__", str(tp))


def _check_type(value, tp, key):
    """Coerce/check `value` against annotation `tp`; raise ConfigError naming `key`.

    Handles `X | None` (`types.UnionType`) and `Optional[X]` (`typing.Union`) alike, `Literal[...]`
    choices, the element types of `list[X]` / `dict[K, V]` (elements named `key[i]` / `key.k`), and
    nested config dataclasses. A bool is never an int, nor a float an int (`max_steps=2.5`)."""
    origin = get_origin(tp)
    if origin is Annotated:  # Annotated[int, Bound(1)]: the type, then the range it carries
        inner, *extras = get_args(tp)
        try:
            value = _check_type(value, inner, key)
        except ConfigError:
            what = next((b.what for b in extras if isinstance(b, Bound) and b.what), None)
            if what is None:
                raise
            raise ConfigError(f"{key} must be {what}, got {value!r}") from None
        for bound in extras:
            if isinstance(bound, Bound):
                check_bound(value, bound, key)
        return value
    if origin is Union or origin is types.UnionType:
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _check_type(value, a, key)
            except ConfigError as e:
                errors.append(str(e))
        # A member's own message when the value had its type but not its content (a NaN float, a
        # list with a wrong element): it says more than the union's name.
        specific = [e for e in errors if not e.startswith(f"{key}: expected ")]
        if specific:
            raise ConfigError(specific[0])
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        choice(value, get_args(tp), key)
        return value
    if dataclasses.is_dataclass(tp):
        return _from_dict(tp, value, key + ".")
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):
        try:
            value = float(value)  # YAML reads 2e-4 as a string
        except ValueError:
            pass
    if tp is float and isinstance(value, float) and not math.isfinite(value):
        # .nan / .inf would run to the end and save a NaN model (or never end): no key takes them.
        raise ConfigError(f"{key} must be a finite number, got {value!r}")
    base = origin or tp
    if base in (int, float, str, bool, dict, list):
        if (isinstance(value, bool) and base is not bool) or not isinstance(value, base):
            raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
        if base is int and not -INT64 <= value < INT64:
            raise ConfigError(f"{key} must fit in 64 bits (|value| < 2**63), got {value!r}")
        if base is list and get_args(tp):
            return [_check_type(v, get_args(tp)[0], f"{key}[{i}]") for i, v in enumerate(value)]
        if base is dict and get_args(tp):
            kt, vt = get_args(tp)
            return {_check_type(k, kt, f"{key} (a key)"): _check_type(v, vt, f"{key}.{k}") for k, v in value.items()}
        return value
    return value


def dotted_keys(cls, prefix: str = "") -> list[str]:
    """Every dotted key of a config dataclass (`train.lr`, `data.max_seq_len`, ...), sections included."""
    hints, out = get_type_hints(cls), []
    for f in dataclasses.fields(cls):
        out.append(prefix + f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            out += dotted_keys(hints[f.name], f"{prefix}{f.name}.")
    return out


def _unknown_key(cls, key, prefix: str, root) -> ConfigError:
    """`unknown config key train.lrr; did you mean train.lr?`: the closest key of the section, else a
    key of that name in another section (`data.lr` -> `train.lr`), else the section's keys listed."""
    names = [f.name for f in dataclasses.fields(cls)]
    hint = did_you_mean(key, names, prefix=prefix)
    if not hint and root is not None and isinstance(key, str):
        elsewhere = [k for k in dotted_keys(root) if k.rsplit(".", 1)[-1] == key and k != prefix + key]
        hint = f"; did you mean {elsewhere[0]}?" if elsewhere else ""
    return ConfigError(f"unknown config key {prefix}{key}" + (hint or f"; known keys here: {sorted(names)}"))


def _from_dict(cls, d: dict, prefix: str = "", root=None):
    """`cls` built from a mapping, each value checked against its annotation; `root`: the whole
    config's class, where a key put in the wrong section is looked for. Every key and value of the
    whole mapping is checked before any section is built: a section's own checks (`__post_init__`)
    may load a task's heavy modules, which a misspelt key elsewhere is answered without."""
    return _build(cls, _checked_values(cls, d, prefix, root))


def _checked_values(cls, d: dict, prefix: str = "", root=None) -> dict:
    """The keyword arguments of `cls` from a mapping, each checked; sections stay mappings."""
    if not isinstance(d, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {d!r}")
    hints = get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = [k for k in d if k not in names]
    if unknown:
        raise _unknown_key(cls, unknown[0], prefix, root if root is not None or prefix else cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in d:
            continue
        tp = hints[f.name]
        key = prefix + f.name
        if dataclasses.is_dataclass(tp):
            kwargs[f.name] = _checked_values(tp, d[f.name] or {}, key + ".", root or cls)
        else:
            kwargs[f.name] = _check_type(d[f.name], tp, key)
            check_bound(kwargs[f.name], f.metadata.get("bound"), key, nullable=type(None) in get_args(tp))
    return kwargs


def _build(cls, kwargs: dict):
    """`cls(**kwargs)`, its sections built first (`_checked_values`' mappings)."""
    hints = get_type_hints(cls)
    return cls(**{k: _build(hints[k], v) if dataclasses.is_dataclass(hints[k]) else v for k, v in kwargs.items()})


def choice(value, allowed, key):
    if value not in allowed:
        raise ConfigError(f"{key} must be one of {list(allowed)}, got {value!r}"
                          + did_you_mean(value, [a for a in allowed if a is not None], quote=True))


# Public names for modules above (`factories.py`); config.py keeps the underscored ones.
check_type = _check_type
type_name = _type_name
from_mapping = _from_dict

"""Registered factories with typed keyword options: how heads (`posbias.registry.HEADS`) and
perturbations (`posbias.registry.PERTURBATIONS`) are built from their config entries, one way.

A factory's keyword parameters are its options, each checked against its annotation
(`posbias.typed`: `int | None`, `Literal[...]`, `Annotated[int, Bound(1)]` for a range) before the
factory runs, so a wrong name or type is one line naming the dotted key. Some parameters are not
options but values posbias fills in (`filled`): a head's `hidden_size`, `null_answer` and
`embedding_size`; a perturbation's `max_seq_len` (data.max_seq_len), `task` and `key` (its dotted
config key, for its own messages). A factory gets a filled value only when it names the parameter,
and a config may not set one. A factory that forwards `**options` to the class it returns (its
return annotation) takes that class's keyword parameters.

Adding a head or a perturbation is then one file with one registration line, e.g.

    @PERTURBATIONS.register("token_dropout")
    def token_dropout(*, p: Annotated[float, Bound(0, 1)] = 0.1, key: str = "perturb[0]"):
        return TokenDropout(p)

(entries are found by name: `perturb: [{name: token_dropout, p: 0.2}]`, and in a Hugging Face
`Trainer` script `posbias.hf.PerturbationCollator(collator, model, tokenizer, "token_dropout", p=0.2)`).
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, get_type_hints

from .errors import ConfigError, did_you_mean
from .typed import check_type


def _keywords(fn) -> dict[str, inspect.Parameter]:
    params = inspect.signature(fn).parameters
    return {n: p for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n != "self"}


def _hints(fn) -> dict:
    try:
        return get_type_hints(fn, include_extras=True)
    except Exception:  # an annotation that does not resolve: the option is then passed unchecked
        return {}


def _forwarded_class(factory):
    """The class a factory with `**options` hands them to (its return annotation), or None."""
    params = inspect.signature(factory).parameters.values()
    if not any(p.kind == p.VAR_KEYWORD for p in params):
        return None
    returned = _hints(factory).get("return")
    return returned if isinstance(returned, type) else None


def parameters(factory) -> dict[str, Any]:
    """Name -> annotation (None where there is none) of every keyword a factory takes, those of the
    class it forwards `**options` to included."""
    out = {n: _hints(factory).get(n) for n in _keywords(factory)}
    cls = _forwarded_class(factory)
    if cls is not None:
        hints = _hints(cls.__init__)
        out.update({n: hints.get(n) for n in _keywords(cls.__init__) if n not in out})
    return out


def option_names(factory, filled=()) -> list[str]:
    """The options a factory takes: its keyword parameters that posbias does not fill in."""
    return sorted(n for n in parameters(factory) if n not in filled)


def option_default(factory, name: str):
    """The default of option `name` (inspect.Parameter.empty where it has none or no such option)."""
    p = _keywords(factory).get(name)
    return inspect.Parameter.empty if p is None else p.default


def build(factory: Callable, options: dict, *, key: str, what: str, filled: dict | None = None,
          also: tuple[str, ...] = ()) -> Any:
    """`factory(**options, **filled)` with every option checked first.

    Args:
        options: the config entry's options (strings, numbers, lists as YAML gives them).
        key: the dotted config key of the options (`model.head_options`, `perturb[0]`).
        what: how messages name the factory (`head 'matrix'`, `random_padding`).
        filled: values posbias provides, passed to the factory only where it names the parameter.
        also: other keys the entry may hold that are not the factory's (`mode`), for suggestions.
    """
    filled = dict(filled or {})
    params = parameters(factory)
    for k in options:
        if k in filled:
            raise ConfigError(f"{key}.{k} is not an option: posbias fills it in")
    known = option_names(factory, filled)
    unknown = sorted((k for k in options if k not in params), key=str)
    if unknown:
        bad = unknown[0]
        listed = ", ".join(known) or "none"
        raise ConfigError(f"{key}: unknown option {bad!r} for {what}"
                          + (did_you_mean(bad, [*known, *also], prefix=f"{key}.")
                             or f" (it takes {listed}{''.join(f'; and {a}' for a in also)})"))
    checked = {k: (check_type(v, params[k], f"{key}.{k}") if params[k] is not None else v) for k, v in options.items()}
    given = {k: v for k, v in filled.items() if k in params}
    try:
        return factory(**checked, **given)
    except TypeError as e:  # a required option left out, or the factory's own signature check
        raise ConfigError(f"{key} for {what}: {e}") from None

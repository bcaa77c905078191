"""Name -> factory registries: tasks, heads, label policies and perturbations plug in by name."""
from __future__ import annotations

from typing import Any, Callable


class Registry:
    """A named table of factories, e.g. `HEADS.register("independent")(IndependentHead)`."""

    def __init__(self, kind: str):
        self.kind = kind
        self._table: dict[str, Callable[..., Any]] = {}

    def register(self, name: str) -> Callable:
        def deco(factory):
            if name in self._table:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._table[name] = factory
            return factory

        return deco

    def get(self, name: str, key: str | None = None) -> Callable[..., Any]:
        """The factory for `name`; `key` is the dotted config key named in the error."""
        if name not in self._table:
            from .errors import ConfigError, did_you_mean

            where = f"{key}: " if key else ""
            raise ConfigError(f"{where}unknown {self.kind} {name!r}"
                              + (did_you_mean(name, self.names(), quote=True) or f"; choose one of {self.names()}"))
        return self._table[name]

    def names(self) -> list[str]:
        return sorted(self._table)


TASKS = Registry("task")
HEADS = Registry("head")
LABEL_POLICIES = Registry("label policy")
PERTURBATIONS = Registry("perturbation")
SEGMENTERS = Registry("segmenter")

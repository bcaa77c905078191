"""Name -> factory registries: tasks, heads, label policies and perturbations plug in by name."""
from __future__ import annotations

import importlib
from typing import Any, Callable


class Registry:
    """A named table of factories, e.g. `HEADS.register("independent")(IndependentHead)`."""

    def __init__(self, kind: str, builtin: dict[str, str] | None = None):
        self.kind = kind
        self._table: dict[str, Callable[..., Any]] = {}
        # name -> the module that registers it when imported, imported the first time the name is
        # asked for: the built-in tasks load torch, which `import posbias` and the CLI's argument
        # errors do without (a registry of plug-ins by module name, as entry points are).
        self._builtin = dict(builtin or {})

    def _load(self, name: str | None = None) -> None:
        for n, module in list(self._builtin.items()):
            if name is None or n == name:
                if n not in self._table:
                    importlib.import_module(module)  # an error here surfaces again at the next ask
                del self._builtin[n]

    def register(self, name: str) -> Callable:
        def deco(factory):
            if name in self._table:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._table[name] = factory
            return factory

        return deco

    def get(self, name: str, key: str | None = None) -> Callable[..., Any]:
        """The factory for `name`; `key` is the dotted config key named in the error."""
        if name not in self._table and name in self._builtin:
            self._load(name)
        if name not in self._table:
            from .errors import ConfigError, did_you_mean

            where = f"{key}: " if key else ""
            raise ConfigError(f"{where}unknown {self.kind} {name!r}"
                              + (did_you_mean(name, self.names(), quote=True) or f"; choose one of {self.names()}"))
        return self._table[name]

    def names(self) -> list[str]:
        self._load()
        return sorted(self._table)

    def values(self) -> list[Any]:
        """Every registered factory (or object), in name order."""
        return [self._table[n] for n in self.names()]


# A task package registers its task object when imported. The core (config, checkpoint) finds a
# task here by name and imports no task package; the built-in ones are imported on first use.
TASKS = Registry("task", builtin={"qa": "posbias.qa", "tagging": "posbias.tagging"})
HEADS = Registry("head")
LABEL_POLICIES = Registry("label policy")
PERTURBATIONS = Registry("perturbation")
SEGMENTERS = Registry("segmenter")

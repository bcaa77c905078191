"""Name -> factory registries: tasks, heads, label policies and perturbations plug in by name.

Plug-ins from outside the package register themselves when their module is imported. In a Python
script, import it; for the CLI (and every process an experiment starts), an installed package
declares its module in the entry-point group `posbias.plugins`, e.g. in its pyproject.toml

    [project.entry-points."posbias.plugins"]
    my_heads = "my_package.posbias_heads"

and posbias imports those modules the first time a name is not among the built-in ones (never at
`import posbias`). Only installed packages are imported this way: no config file names code to run.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable

from .errors import ConfigError, did_you_mean

PLUGIN_GROUP = "posbias.plugins"
_plugins = {"loaded": False}


def load_plugins() -> list[str]:
    """Import every module of the `posbias.plugins` entry points (once per process); returns their
    names. A plug-in that fails to import is a ConfigError naming it."""
    if _plugins["loaded"]:
        return []
    _plugins["loaded"] = True
    from importlib.metadata import entry_points

    names = []
    for ep in entry_points(group=PLUGIN_GROUP):
        try:
            ep.load()
        except Exception as e:  # the plug-in's own error, named by its entry point
            raise ConfigError(f"posbias plug-in {ep.name!r} ({ep.value}) failed to import: "
                              f"{type(e).__name__}: {e}") from None
        names.append(ep.name)
    return names


class Registry:
    """A named table of factories, e.g. `HEADS.register("independent")(IndependentHead)`."""

    def __init__(self, kind: str, builtin: dict[str, str] | None = None):
        self.kind = kind
        self._table: dict[str, Callable[..., Any]] = {}
        self._traits: dict[str, dict[str, Any]] = {}
        # name -> the module that registers it when imported, imported the first time the name is
        # asked for: the built-in tasks load torch, which `import posbias` and the CLI's argument
        # errors do without (a registry of plug-ins by module name, as entry points are).
        self._builtin = dict(builtin or {})
        self._sources: list[str] = []  # modules registering names not known in advance (`load_on_use`)

    def load_on_use(self, module: str) -> None:
        """Import `module`, which registers names here, the first time this registry is asked for a
        name it lacks or for all its names: a task package declares its torch-backed heads this way,
        so that reading and checking a config does not load torch."""
        if module not in self._sources:
            self._sources.append(module)

    def _load(self, name: str | None = None) -> None:
        for n, module in list(self._builtin.items()):
            if name is None or n == name:
                if n not in self._table:
                    importlib.import_module(module)  # an error here surfaces again at the next ask
                del self._builtin[n]
        if name is None or name not in self._table:
            while self._sources:
                importlib.import_module(self._sources[0])  # an error here surfaces again at the next ask
                self._sources.pop(0)

    def register(self, name: str, **traits) -> Callable:
        """A decorator registering a factory under `name`; `traits`: what it declares about itself,
        read before anything is built (a head's `debias=True`: it can take `train.debias`)."""
        def deco(factory):
            if name in self._table:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._table[name] = factory
            self._traits[name] = dict(traits)
            return factory

        return deco

    def traits(self, name: str, key: str | None = None) -> dict[str, Any]:
        """What the factory `name` declared when it was registered ({} for nothing)."""
        self.get(name, key)
        return dict(self._traits.get(name, {}))

    def with_trait(self, trait: str) -> list[str]:
        """The names whose registration declared `trait` true, in name order."""
        return [n for n in self.names() if self._traits.get(n, {}).get(trait)]

    def get(self, name: str, key: str | None = None) -> Callable[..., Any]:
        """The factory for `name`; `key` is the dotted config key named in the error."""
        if name not in self._table:
            self._load(name)
        if name not in self._table:
            load_plugins()
        if name not in self._table:
            where = f"{key}: " if key else ""
            raise ConfigError(f"{where}unknown {self.kind} {name!r}"
                              + (did_you_mean(name, self.names(), quote=True) or f"; choose one of {self.names()}"))
        return self._table[name]

    def names(self) -> list[str]:
        self._load()
        load_plugins()
        return sorted(self._table)

    def values(self) -> list[Any]:
        """Every registered factory (or object), in name order."""
        return [self._table[n] for n in self.names()]


# A task package registers its task object when imported. The core (config, checkpoint) finds a
# task here by name and imports no task package; the built-in ones are imported on first use.
TASKS = Registry("task", builtin={"qa": "posbias.qa", "tagging": "posbias.tagging"})
# Diagnoses of models that no task trains (`posbias diagnose NAME`): each adds its own sub-parser to
# the CLI (`name`, `cli_help`, `cli_commands`, `add_cli_arguments`, as a task does).
DIAGNOSES = Registry("diagnosis", builtin={"retrieval": "posbias.retrieval.command",
                                          "generation": "posbias.generation.command"})
# Heads declare `debias=True` when `train.debias` can act on them (`posbias.qa.debias`).
HEADS = Registry("head")
LABEL_POLICIES = Registry("label policy")
PERTURBATIONS = Registry("perturbation")
SEGMENTERS = Registry("segmenter")

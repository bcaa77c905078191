"""The tasks' front door, above `qa/` and `tagging/`: `get_task("qa")`, `get_task("tagging")`.

A task is any object with the protocol documented in `posbias.training` (no base class). Importing
its package registers it in `posbias.registry.TASKS`; this module imports both built-in packages
(modules above the tasks use it). The core (config, checkpoint) looks tasks up in that registry by
name and imports no task package.
"""
from __future__ import annotations

from . import qa, tagging  # noqa: F401  (each registers its task)
from .registry import TASKS


def get_task(name: str, key: str | None = None):
    """The registered task `name`; `key` is the config key named in the error."""
    return TASKS.get(name, key)


def all_tasks() -> list:
    return TASKS.values()

"""The task registry's front door: `get_task("qa")` / `get_task("tagging")`.

A task is any object with the protocol documented in `posbias.training` (no base class); importing
its package registers it in `posbias.registry.TASKS`.
"""
from __future__ import annotations

from .registry import TASKS


def _register_builtin() -> None:
    from . import qa, tagging  # noqa: F401  (each registers its task)


def get_task(name: str, key: str | None = None):
    """The registered task `name`; `key` is the config key named in the error."""
    _register_builtin()
    return TASKS.get(name, key)


def all_tasks() -> list:
    _register_builtin()
    return [TASKS.get(n) for n in TASKS.names()]

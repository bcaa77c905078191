"""A test perturbation that only waits (`_test_slow`: 50 ms per micro-batch), so that a tiny run is
still training when a test signals it (tests/core/test_interrupt.py). Importing this module
registers it; a child process imports it before running the CLI."""
from __future__ import annotations

import time

from posbias.registry import PERTURBATIONS

WAIT_S = 0.05


def _slow():
    def apply(batch, gen):
        time.sleep(WAIT_S)
        return batch
    return apply


if "_test_slow" not in PERTURBATIONS.names():
    PERTURBATIONS.register("_test_slow")(_slow)

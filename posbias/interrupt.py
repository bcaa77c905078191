"""SIGTERM and SIGINT while a run is in progress: the run ends `interrupted`, not killed mid-write.

A scheduler stops a job with SIGTERM (Slurm at its time limit, `docker stop`, posbias's own GPU lanes),
a person with Ctrl-C (SIGINT). Left to their defaults, SIGTERM ends the process where it stands and
run_info.json keeps saying `running`. Inside `stop_on_signals()` either signal raises `Interrupted`,
a KeyboardInterrupt, so that whatever records Ctrl-C records it (run_info.json and the experiment
store say `interrupted`) and the CLI exits 128 + the signal's number (143, 130), as the shell reports
a process that signal ended. In `Stop.deferred()` (the training loop) a first signal only sets a
flag, which the loop reads after each optimizer step: it saves the resume state, then raises; a
second signal raises at once.

The handlers are installed only for the block and the previous ones put back after it, so that
importing posbias changes nothing and a library caller of `posbias.train` gets its own handlers
back. Only the main thread can install handlers: elsewhere the block runs with the process's own.
A signal the process ignores (SIG_IGN: a background job of a non-interactive shell ignores SIGINT)
stays ignored, and one handled outside Python (`signal.getsignal` is None) is left alone.
"""
from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(KeyboardInterrupt):
    """The run was stopped by the signal `signum`; `exit_code` is what the CLI exits with (128 + signum)."""

    def __init__(self, signum: int):
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(signal.Signals(signum).name)


class Stop:
    """The handler of `stop_on_signals`, and what the loop asks it: whether a signal came (`signum`)."""

    def __init__(self):
        self.signum: int | None = None  # the first signal that came while deferred
        self._defer = False

    def __call__(self, signum, frame) -> None:
        if self._defer and self.signum is None:
            self.signum = signum  # the loop stops at its next look (`raise_if_requested`)
            return
        raise Interrupted(signum)  # not deferred, or the second signal: at once

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str | None:
        """The signal that came, as "SIGTERM"; None before one did."""
        return signal.Signals(self.signum).name if self.signum is not None else None

    def raise_if_requested(self) -> None:
        if self.signum is not None:
            raise Interrupted(self.signum)

    @contextmanager
    def deferred(self, enabled: bool = True) -> Iterator[Stop]:
        """While the block runs (and `enabled`), a first signal waits for the block to look at
        `requested`. A signal that came after its last look raises when the block ends."""
        self._defer = enabled
        try:
            yield self
        finally:
            self._defer = False
        self.raise_if_requested()


@contextmanager
def stop_on_signals() -> Iterator[Stop]:
    """SIGTERM and SIGINT raise `Interrupted` while the block runs (see `Stop.deferred`); the previous
    handlers are put back at its end."""
    stop = Stop()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in SIGNALS:
            old = signal.getsignal(signum)
            if old is None or old == signal.SIG_IGN:  # handled outside Python, or ignored: left as it is
                continue
            previous[signum] = signal.signal(signum, stop)
    try:
        yield stop
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)

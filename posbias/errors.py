"""Errors posbias raises for bad input: each names the file and the record."""


class PosbiasError(Exception):
    """Base class: an error the user can fix (bad config, bad data, bad path)."""


class ConfigError(PosbiasError, ValueError):
    """A config value is unknown, mistyped or inconsistent; the message names the dotted key."""


class DataError(PosbiasError, ValueError):
    """A data record is malformed; the message names the file and the record id."""

    def __init__(self, path, record, reason):
        self.path, self.record, self.reason = str(path), record, reason
        where = f"{self.path}" + (f": record {record!r}" if record is not None else "")
        super().__init__(f"{where}: {reason}")


class RunError(PosbiasError, RuntimeError):
    """A run launched as a subprocess failed (its own output says why)."""


class TrainingError(PosbiasError, RuntimeError):
    """Training cannot go on (e.g. the loss became NaN/inf); the message names the step and the
    last good checkpoint."""

"""Errors posbias raises for bad input: each names the file and the record."""
import difflib


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


def did_you_mean(name, known, *, prefix: str = "", quote: bool = False) -> str:
    """`; did you mean <prefix><match>?` naming the known name closest to a misspelled one, or ""
    when none is close (difflib's ratio >= 0.6, case-insensitive).

    Every "unknown key / option / name" error appends it, so that `train.lrr` points at `train.lr`
    instead of leaving the user to read a list of 25 keys. One guess only: the error stays one line.
    """
    if not isinstance(name, str):
        return ""
    by_lower: dict[str, str] = {}
    for k in known:
        if isinstance(k, str):
            by_lower.setdefault(k.lower(), k)
    match = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.6)
    if not match:
        return ""
    guess = prefix + by_lower[match[0]]
    return f"; did you mean {guess!r}?" if quote else f"; did you mean {guess}?"

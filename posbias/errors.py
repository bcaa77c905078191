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


class ServerError(PosbiasError, RuntimeError):
    """An LLM server (an `--endpoint`, or llama.cpp's server posbias started) refused a request, answered
    something posbias cannot use, or stopped answering; the message names the server."""


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


def keyword_names(fn) -> list[str]:
    """The keyword arguments `fn` takes by name (its positional-or-keyword and keyword-only
    parameters), for option checks."""
    import inspect

    params = inspect.signature(fn).parameters.values()
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def check_keywords(fn, options: dict, what: str) -> None:
    """Refuse an option `fn` does not take, by name (`diagnose qa takes no option 'k_max'`), before
    a TypeError from deep inside the call."""
    known = keyword_names(fn)
    unknown = sorted(k for k in options if k not in known)
    if unknown:
        raise ConfigError(f"{what} takes no option {unknown[0]!r}" + did_you_mean(unknown[0], known, quote=True))


def _first_line(e: BaseException, limit: int = 300) -> str:
    text = " ".join(str(e).split())
    return text[:limit] + (" ..." if len(text) > limit else "")


def os_error_message(e: OSError) -> str:
    """`FILE: strerror` for an OS error (read-only folder, disk full, missing file), naming both
    paths of a failed rename or copy."""
    what = e.strerror or _first_line(e) or type(e).__name__
    if e.filename is None:
        return what
    where = str(e.filename) + (f" -> {e.filename2}" if getattr(e, "filename2", None) else "")
    hint = "; free some space and run the command again" if e.errno == 28 else ""  # ENOSPC
    return f"{where}: {what}{hint}"


def known_failure(e: BaseException) -> str | None:
    """The one-line message for a failure the user can act on — bad input, a damaged file, the
    environment (read-only folder, full disk, memory) — or None for an unexpected exception (a bug,
    which keeps its traceback).

    Readers turn most of these into a PosbiasError naming the file where they open it; this is the
    net under all of them, used by the CLI's exception boundary and by `run_info.json`'s `error`.
    """
    import json
    import pickle
    import sqlite3

    if isinstance(e, PosbiasError):
        return str(e)  # already one line naming the file or key
    if isinstance(e, OSError):
        return os_error_message(e)
    if isinstance(e, json.JSONDecodeError):
        return f"a file is not valid JSON ({e.msg}: line {e.lineno} column {e.colno})"
    if isinstance(e, UnicodeDecodeError):
        return f"a file is not valid UTF-8 text ({e.reason} at byte {e.start})"
    if isinstance(e, UnicodeEncodeError):
        return f"text is not valid Unicode ({e.reason}: {e.object[e.start:e.end]!r} at character {e.start})"
    if isinstance(e, RecursionError):
        return "an input file is nested too deeply to read (arrays or objects inside each other)"
    if isinstance(e, pickle.UnpicklingError):
        return ("refused to load a pickled file: it holds objects other than tensors and plain values, which "
                f"could run code ({_first_line(e, 160)})")
    if isinstance(e, sqlite3.DatabaseError):
        return f"the experiment store is damaged, locked or not a posbias store (sqlite: {_first_line(e)})"
    if type(e).__name__ == "SafetensorError":  # safetensors' (Rust) error: a damaged or unwritable weights file
        return f"a safetensors file is damaged or could not be written ({_first_line(e)})"
    if isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError":  # torch's (CUDA) OOM
        return ("out of memory; lower train.batch_size / train.eval_batch_size or data.max_seq_len "
                f"({_first_line(e, 160) or 'MemoryError'})")
    return None


def failure_message(e: BaseException) -> str:
    """One line for any exception: `known_failure`'s message, else the exception's type and text."""
    if isinstance(e, KeyboardInterrupt):  # Ctrl-C, or a run's SIGTERM / SIGINT (its name: `interrupt.Interrupted`)
        return f"interrupted ({e})" if str(e) else "interrupted"
    return known_failure(e) or f"{type(e).__name__}: {_first_line(e)}"

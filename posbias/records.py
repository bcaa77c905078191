"""Reading records from data files, shared by every reader (SQuAD, MRQA, CoNLL, CoNLL-U).

One policy for bad input: a malformed record raises `DataError` naming the file and the record
(question id, line number); with `on_bad_record="skip"` it is dropped and listed instead, so the
reader returns the valid records plus an account of the skipped ones. File-level problems
(unreadable, corrupt gzip, bad UTF-8) always raise.
"""
from __future__ import annotations

import os
import stat
from collections.abc import Iterable

from .errors import DataError
from .limits import data_limit, gunzip, read_bytes

ON_BAD_RECORD = ("error", "skip")
_GZIP_MAGIC = b"\x1f\x8b"


def check_on_bad_record(value: str) -> None:
    if value not in ON_BAD_RECORD:
        raise ValueError(f"on_bad_record must be one of {ON_BAD_RECORD}, got {value!r}")


# The text of each stream read (a pipe, FIFO or socket: stdin, /dev/fd/N, a named FIFO): a stream can
# be read once only, and a reader may read a file twice (tagging sniffs the format, then reads it; a
# column hint reads it again). Read a second time, a pipe would give nothing and a FIFO would wait
# for a new writer. Each text is at most `data_limit()`, and a command reads few streams.
_STREAMS: dict[tuple[int, int, int], str] = {}


def _stream_key(path) -> tuple[int, int, int] | None:
    """(device, inode, ctime) of a stream, None for anything else. The ctime (set when the FIFO is
    made, moved on by each write) tells a new FIFO that reuses a removed one's inode from it."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None  # read_bytes says why
    if not (stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode)):
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns


def read_text(path) -> str:
    """The file as text; gunzipped when it starts with the gzip magic bytes, whatever its suffix.
    Bounded (`limits`): a device, a file or gunzipped stream over `data_limit()`, or a gzip bomb is
    refused with one line instead of filling memory. A stream (stdin, a pipe, a FIFO, a socket) is
    read once, to its end, and its text kept for the process's later reads of it (`_STREAMS`)."""
    key = _stream_key(path)
    if key in _STREAMS:
        return _STREAMS[key]
    text = _read_text(path)
    if key is not None:
        _STREAMS[_stream_key(path) or key] = text  # its key once written to the end: what a reread finds
    return text


def _read_text(path) -> str:
    limit = data_limit()
    raw = read_bytes(path, "data file", limit, data=True)
    gzipped = raw[:2] == _GZIP_MAGIC
    if gzipped:
        raw = gunzip(raw, path, "data file", limit)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        where = f"byte {e.start}" + (" of the gunzipped data" if gzipped else "")
        line = raw.count(b"\n", 0, e.start) + 1
        raise DataError(path, None, f"invalid UTF-8 at {where} (line {line})") from None
    return text.removeprefix("\ufeff")  # a byte-order mark is not part of the data


def is_text(value) -> bool:
    """A string with a non-space character (checked only: the string itself is kept as is)."""
    return isinstance(value, str) and bool(value.strip())


def unicode_problem(text: str, from_bytes: bool = False) -> str | None:
    """Why `text` cannot be written as UTF-8 (a lone surrogate: JSON's "\\ud800", or a command-line
    byte that was not UTF-8), or None. Caught where text comes in, so that the tokenizer (a TypeError)
    and the JSON writers (a UnicodeEncodeError) never meet it. `from_bytes`: `text` was decoded with
    surrogateescape (the command line), so such a surrogate stands for a byte."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        ch = e.object[e.start]
        if from_bytes and 0xDC80 <= ord(ch) <= 0xDCFF:  # Python's stand-in for a byte that was not UTF-8 (surrogateescape)
            return f"is not valid UTF-8 (byte 0x{ord(ch) - 0xDC00:02x} at character {e.start})"
        return f"is not valid Unicode text (a lone surrogate {ch!r} at character {e.start})"
    return None


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON true is not an offset


def collect(items: Iterable, on_bad_record: str, records: list, skipped: list[tuple[str, str]]) -> None:
    """Append each record; raise each `DataError`, or under `skip` list it as (record, reason)."""
    for item in items:
        if not isinstance(item, DataError):
            records.append(item)
        elif on_bad_record == "error":
            raise item
        else:
            skipped.append((str(item.record), item.reason))


def duplicate(seen: dict[str, tuple[str, str]], record_id: str, path: str) -> str | None:
    """The reason a record id is a repeat, or None; `seen` maps id -> (path, where)."""
    if record_id not in seen:
        return None
    first_path, first_where = seen[record_id]
    elsewhere = f" of {first_path}" if first_path != path else ""
    return f"duplicate id (first at {first_where}{elsewhere})"

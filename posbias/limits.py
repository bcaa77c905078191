"""Bounds on what posbias reads whole, so that a hostile or mistaken input fails at once with one
line naming the file and the limit instead of filling memory: a YAML alias bomb ("billion
laughs": 761 bytes expanding past 2 GB), a device such as /dev/zero given as a data file, a gzip
bomb (a few MB expanding to GBs), JSON nested deeper than Python's recursion limit.

Data files may be large (SQuAD train ~40 MB, MRQA files ~1 GB), so their limit is generous and
can be raised with the environment variable `POSBIAS_MAX_FILE_BYTES` (read at each call); model
and state files (config.json, trainer_state.json, ...) and YAML configs are small by nature.
"""
from __future__ import annotations

import json
import os
import stat
import zlib

import yaml

from .errors import ConfigError, DataError

MIB = 1 << 20
DATA_LIMIT_ENV = "POSBIAS_MAX_FILE_BYTES"
DEFAULT_DATA_LIMIT = 4096 * MIB  # the largest MRQA training file is ~1.5 GB of JSONL
JSON_LIMIT = 256 * MIB  # a model or state JSON file (the largest tokenizer.json files are ~35 MB)
JSON_MAX_DEPTH = 100  # nesting levels of such a file (real ones have fewer than 10)
YAML_LIMIT = 4 * MIB  # a config, an override value, an experiment spec
YAML_MAX_NODES = 100_000  # scalars + collections once every alias is expanded (a preset has ~100)
YAML_MAX_DEPTH = 100
# A gzip bomb is refused as soon as its output passes GZIP_RATIO_FLOOR with more than MAX_GZIP_RATIO
# bytes out per byte in; text data compresses ~3-10x, so real files never come near it.
GZIP_RATIO_FLOOR = 64 * MIB
MAX_GZIP_RATIO = 100
_CHUNK = MIB


def mib(n: int) -> str:
    return f"{n / MIB:,.0f} MiB" if n >= MIB else f"{n:,} bytes"


def memory_bytes() -> int | None:
    """The machine's physical memory (bytes), or None where it cannot be read."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def data_limit() -> int:
    """The largest data file (after gunzipping) posbias reads: `POSBIAS_MAX_FILE_BYTES`, else 4 GiB or a
    quarter of the machine's memory, whichever is smaller. A stream (a pipe, a FIFO) has no size to check
    first, so it is read into memory up to the bound, and parsing needs about as much again: the default
    keeps that well inside the machine."""
    raw = os.environ.get(DATA_LIMIT_ENV, "").strip()
    if not raw:
        memory = memory_bytes()
        return min(DEFAULT_DATA_LIMIT, memory // 4) if memory else DEFAULT_DATA_LIMIT
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigError(f"{DATA_LIMIT_ENV}={raw!r}: must be a positive number of bytes")
    return value


def _too_big(path, what: str, limit: int, data: bool):
    msg = (f"larger than the {mib(limit)} limit for {what}"
           + (f" (raise it with {DATA_LIMIT_ENV}=<bytes>)" if data else ""))
    return DataError(path, None, msg) if data else ConfigError(f"{path}: {msg}")


def _fail(path, reason: str, data: bool):
    return DataError(path, None, reason) if data else ConfigError(f"{path}: {reason}")


def read_bytes(path, what: str, limit: int, *, data: bool = False) -> bytes | bytearray:
    """The bytes of `path`, refusing (one line naming the file and the limit) a device (/dev/zero
    never ends), a file over `limit`, and a stream that delivers more than `limit`.

    One bound for every input, counted as the bytes come: a regular file's size is checked before
    any read; a stream has no size (stdin, a pipe or FIFO, a socket given as /dev/stdin or
    /dev/fd/N, a file that grows) and is read chunk by chunk into one buffer grown in place, refused
    as soon as more than `limit` bytes have come. So `yes | posbias ... --data /dev/stdin` stops at
    the bound, holding at most the bound, and a small piped file reads as a file does.

    Args:
        what: what the file is, for the message (`data file`, `trainer state`).
        data: raise DataError (a data file) instead of ConfigError.
    """
    try:
        mode = os.stat(path).st_mode
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
            raise _fail(path, f"is a device, not a {what}: give a regular file (or a pipe)", data)
        if stat.S_ISSOCK(mode):
            # A socket cannot be opened by name (ENXIO), only read through a descriptor this process
            # already holds: stdin (or /dev/fd/N) connected to one.
            fd = _own_descriptor(path)
            if fd is None:
                raise _fail(path, f"is a socket, not a {what}: give a regular file, or pipe the data to stdin", data)
            f = os.fdopen(os.dup(fd), "rb")
        else:
            f = open(path, "rb")
        with f:
            st = os.fstat(f.fileno())
            size = st.st_size if stat.S_ISREG(st.st_mode) else 0
            if size > limit:
                raise _too_big(path, what, limit, data)
            # read(n) allocates n bytes at once: ask for the size the file has; only if more comes
            # (a stream, a /proc file, a file that grew) go on in chunks, counted against the limit.
            head = f.read(size + 1) if size else b""
            if size and len(head) <= size:
                return head
            buf = bytearray(head)  # grown in place (realloc), not chunks joined at the end: no second copy
            while len(buf) <= limit:
                chunk = f.read(min(_CHUNK, limit + 1 - len(buf)))
                if not chunk:
                    break
                buf += chunk
    except OSError as e:
        raise _fail(path, f"cannot read file: {e.strerror or e}", data) from None
    if len(buf) > limit:
        raise _too_big(path, what, limit, data)
    return buf


def _own_descriptor(path) -> int | None:
    """The descriptor of this process that `path` names (/dev/stdin, /dev/fd/N, /proc/self/fd/N),
    when it is the very file `path` leads to; else None."""
    p = os.path.abspath(str(path))
    head, tail = os.path.split(p)
    if p == "/dev/stdin":
        fd = 0
    elif tail.isdigit() and head in ("/dev/fd", "/proc/self/fd", f"/proc/{os.getpid()}/fd"):
        fd = int(tail)
    else:
        return None
    try:
        return fd if os.path.samestat(os.stat(p), os.fstat(fd)) else None
    except OSError:
        return None


def gunzip(raw: bytes, path, what: str, limit: int, *, data: bool = True) -> bytearray:
    """The decompressed bytes of gzip data (every member, as `gzip.decompress`), streamed so that a
    bomb is refused once its output passes `limit`, or passes `GZIP_RATIO_FLOOR` at more than
    `MAX_GZIP_RATIO` bytes out per byte in, before it is ever held whole. A bytearray, grown in place:
    no second copy of a large file."""
    out, size, done, rest = bytearray(), 0, 0, raw  # done: input bytes of the members already read
    try:
        while rest:
            d = zlib.decompressobj(zlib.MAX_WBITS | 16)  # 16: gzip header and CRC checked by zlib
            buf = rest
            while True:
                piece = d.decompress(buf, _CHUNK)
                buf = d.unconsumed_tail
                out += piece
                size += len(piece)
                used = max(done + len(rest) - len(buf) - len(d.unused_data), 1)
                if size > limit:
                    raise _too_big(path, what + " (gunzipped)", limit, data)
                if size > GZIP_RATIO_FLOOR and size > MAX_GZIP_RATIO * used:
                    raise _fail(path, f"gunzips to more than {MAX_GZIP_RATIO}x its size ({mib(size)} from the "
                                      f"first {mib(used)}): refused as a decompression bomb", data)
                if d.eof or not (buf or piece):
                    break
            if not d.eof:
                raise _fail(path, "corrupt gzip data: the file ends before the end of the compressed stream", data)
            done += len(rest) - len(d.unused_data)
            rest = d.unused_data.lstrip(b"\0")  # gzip pads members with zero bytes
            if rest and not rest.startswith(b"\x1f\x8b"):
                raise _fail(path, f"corrupt gzip data: not gzip data after byte {done}", data)
    except zlib.error as e:
        raise _fail(path, f"corrupt gzip data: {e}", data) from None
    return out


def depth_over(obj, limit: int) -> bool:
    """Whether parsed JSON nests deeper than `limit` (iterative: the check itself cannot recurse)."""
    stack = [(obj, 1)]
    while stack:
        x, depth = stack.pop()
        if isinstance(x, (dict, list)):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in (x.values() if isinstance(x, dict) else x))
    return False


def load_json(path, what: str, limit: int = JSON_LIMIT, *, data: bool = False, max_depth: int = JSON_MAX_DEPTH):
    """A JSON file read whole, bounded: at most `limit` bytes and `max_depth` levels of nesting;
    unreadable, oversized, non-UTF-8, invalid or too deeply nested JSON is one line naming the file
    (ConfigError, or DataError with `data`).

    Args:
        what: what the file is, for the size message (`trainer state`, `model config`).
    """
    raw = read_bytes(path, what, limit, data=data)
    try:
        obj = json.loads(raw.decode("utf-8").removeprefix("\ufeff"))
    except UnicodeDecodeError as e:
        raise _fail(path, f"not UTF-8 text (byte {e.start})", data) from None
    except json.JSONDecodeError as e:
        raise _fail(path, f"not valid JSON ({e.msg} at line {e.lineno} column {e.colno})", data) from None
    except RecursionError:  # json recurses once per nesting level
        raise _fail(path, f"JSON nested deeper than {max_depth} levels", data) from None
    if depth_over(obj, max_depth):
        raise _fail(path, f"JSON nested deeper than {max_depth} levels", data)
    return obj


def check_yaml_text(text: str, what: str) -> None:
    if len(text) > YAML_LIMIT:
        raise ConfigError(f"{what}: larger than the {mib(YAML_LIMIT)} limit for YAML text")


def check_yaml_graph(node, what: str) -> None:
    """Refuse a composed YAML document that would be a bomb once its aliases are expanded: more than
    `YAML_MAX_NODES` nodes in all (each alias counting its whole target again), an anchor used inside
    itself, or nesting deeper than `YAML_MAX_DEPTH`. Sizes are memoised per node, so the check costs
    the size of the text, not of the expansion."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(n, depth: int) -> int:
        key = id(n)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise ConfigError(f"{what}: a YAML alias refers to a node that contains it (a recursive anchor)")
        if depth > YAML_MAX_DEPTH:
            raise ConfigError(f"{what}: YAML nested deeper than {YAML_MAX_DEPTH} levels")
        total = 1
        if isinstance(n, (yaml.SequenceNode, yaml.MappingNode)):
            open_nodes.add(key)
            children = n.value if isinstance(n, yaml.SequenceNode) else [c for pair in n.value for c in pair]
            for child in children:
                total += size(child, depth + 1)
                if total > YAML_MAX_NODES:
                    raise ConfigError(f"{what}: YAML expands to more than {YAML_MAX_NODES:,} values once its "
                                      "aliases (*name) are expanded; refused as an alias bomb")
            open_nodes.discard(key)
        sizes[key] = total
        return total

    size(node, 1)

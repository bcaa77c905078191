"""Small shared helpers: atomic file writes, run metadata, seeding."""
from __future__ import annotations

import functools
import itertools
import json
import math
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from .errors import ConfigError
from .version import __version__


_UMASK = os.umask(0o022)
os.umask(_UMASK)  # read the process umask (os.umask can only read it by setting it)


def atomic_write_text(path, text) -> None:
    """Write via a temporary file + rename, so a crash never leaves a half-written file. `text` is a
    string or an iterable of strings written one after another (nothing joined in memory)."""
    _atomic_write(path, "w", lambda f: f.write(text) if isinstance(text, str) else f.writelines(text))


def atomic_write_bytes(path, data: bytes) -> None:
    """`atomic_write_text` for bytes (a safetensors file)."""
    _atomic_write(path, "wb", lambda f: f.write(data))


def _atomic_write(path, mode: str, write) -> None:
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, mode, **({"encoding": "utf-8"} if "b" not in mode else {})) as f:
            write(f)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600 files; results are for sharing
        os.replace(tmp, path)
    except BaseException as e:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise named_os_error(e, path)


def atomic_write_json(path, obj, indent: int | None = 2) -> None:
    """`json_text(obj, indent)` plus a newline, written atomically and streamed: the text is never
    held whole in memory (SQuAD dev's nbest.json is ~150 MB)."""
    atomic_write_text(path, itertools.chain(_json_chunks(obj, indent), ["\n"]))


def json_text(obj, indent: int | None = None) -> str:
    """`json.dumps(obj, indent=indent, ensure_ascii=False)`, but every NaN or ±inf float written as
    null: JSON has no such numbers, and Python's `NaN`/`Infinity` tokens make a file that other
    readers (and Python's own with `parse_constant`) refuse."""
    try:  # the common case: no non-finite float, one pass through json's C encoder
        return json.dumps(obj, indent=indent, ensure_ascii=False, allow_nan=False)
    except ValueError as e:
        if "Out of range float" not in str(e):
            raise
    return json.dumps(finite_or_none(obj), indent=indent, ensure_ascii=False, allow_nan=False)


def finite_or_none(obj):
    """`obj` with each non-finite float (NaN, ±inf; NumPy float64 included) in its dicts, lists and
    tuples replaced by None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v) for v in obj]
    return obj


def _json_chunks(obj, indent: int | None):
    """The text of `json_text(obj, indent)` in pieces: a dict with string keys one item at a time
    (each item through json's C encoder), anything else whole."""
    if not (isinstance(obj, dict) and obj and all(isinstance(k, str) for k in obj)):
        yield json_text(obj, indent)
        return
    # JSON strings hold no raw newline, so indenting an item's lines by one level is a replace.
    pad = "\n" + " " * indent if indent is not None else ""
    sep = "," + pad if indent is not None else ", "
    yield "{" + pad
    for i, (key, value) in enumerate(obj.items()):
        item = json_text(value, indent)
        yield (sep if i else "") + json.dumps(key, ensure_ascii=False) + ": " + (item.replace("\n", pad) if pad else item)
    yield ("\n" if indent is not None else "") + "}"


def check_ranges(result: dict, percentages, what: str) -> None:
    """Raise rather than let a metrics dict (nested at any depth) be written with a number that is not
    finite, or a percentage (a key in `percentages`) outside 0..100. Scores computed from strings or
    counts cannot produce either; only a bug can, and a report must not show it as a finding.
    `what` names the metrics in the message ("QA metrics")."""
    stack = [("", result)]
    while stack:
        where, x = stack.pop()
        if isinstance(x, dict):
            stack.extend((f"{where}.{k}" if where else str(k), v) for k, v in x.items())
        elif isinstance(x, float) and not (math.isfinite(x) and (where.rsplit(".", 1)[-1] not in percentages
                                                                  or 0.0 <= x <= 100.0)):
            raise RuntimeError(f"{what}: {where} = {x} is outside its range (a percentage is 0..100, "
                               "every value finite); not written")


def named_os_error(e: BaseException, path) -> BaseException:
    """`e`, or for an OS error that names no file or only a temporary one (a write on a full disk,
    mkstemp in a read-only folder) the same error naming `path`: the file the user knows."""
    if isinstance(e, OSError) and (e.filename is None or Path(str(e.filename)).name.endswith(".tmp")):
        named = OSError(e.errno, e.strerror or str(e), str(path))  # OSError(errno, ...) picks the subclass
        named.__cause__ = e
        return named
    return e


def save_safetensors(tensors: dict, path, metadata: dict | None = None) -> None:
    """`safetensors.torch.save_file`, whose I/O failures (a full disk) become the OSError they are,
    naming the file (safetensors reports "I/O error: ... (os error 28)" and no path)."""
    import re

    from safetensors import SafetensorError
    from safetensors.torch import save_file

    try:
        save_file(tensors, str(path), metadata=metadata)
    except SafetensorError as e:
        code = re.search(r"\(os error (\d+)\)", str(e))
        if code is None:
            raise
        raise OSError(int(code.group(1)), os.strerror(int(code.group(1))), str(path)) from None


def replace_dir(tmp_dir: Path, final_dir: Path) -> None:
    """Move a fully written `tmp_dir` into place as `final_dir` (the old one removed last)."""
    final_dir = Path(final_dir)
    old = final_dir.with_name(final_dir.name + ".old")
    for p in (Path(tmp_dir), final_dir, old):  # never move or rmtree through a link into another folder
        if p.is_symlink():
            raise ConfigError(f"{p} is a symbolic link; posbias never writes or deletes through a link there: "
                              "remove the link")
    if old.exists():
        shutil.rmtree(old)
    if final_dir.exists():
        os.replace(final_dir, old)
    os.replace(tmp_dir, final_dir)
    if old.exists():
        shutil.rmtree(old)


def recover_dir(final_dir, marker: str) -> bool:
    """Finish a `replace_dir(<final>.tmp, final_dir)` that a crash interrupted between its renames.

    With `final_dir` gone, the newest complete copy takes its place: `<final>.tmp` (fully written:
    it holds `marker`, the file written last) before `<final>.old` (the previous version). Returns
    whether `final_dir` now holds `marker`. Safe when several processes of one run call it at once.
    """
    final_dir = Path(final_dir)
    if not final_dir.exists():
        for candidate in (final_dir.with_name(final_dir.name + ".tmp"), final_dir.with_name(final_dir.name + ".old")):
            if (candidate / marker).is_file():
                try:
                    os.replace(candidate, final_dir)
                except OSError:  # another process of the run moved it first
                    pass
                break
    old = final_dir.with_name(final_dir.name + ".old")
    if (final_dir / marker).is_file() and old.exists():
        shutil.rmtree(old, ignore_errors=True)
    return (final_dir / marker).is_file()


def interactive() -> bool:
    """Progress bars only on a terminal: in a log file tqdm's carriage returns and cursor moves
    (nested bars) become one long line of escapes, so there the training loop prints plain lines."""
    return sys.stderr.isatty()


def set_seed(seed: int) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def cpu_name() -> str:
    """The CPU model (Linux /proc/cpuinfo), for benchmark records; `platform.processor()` elsewhere."""
    from pathlib import Path

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def versions() -> dict:
    """Versions of Python and the libraries a result depends on, plus the git commit if any."""
    import accelerate
    import tokenizers
    import torch
    import transformers

    out = {
        "posbias": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "accelerate": accelerate.__version__,
        "tokenizers": tokenizers.__version__,
        "numpy": np.__version__,
    }
    out.update(_package_git_state())
    return out


@functools.cache
def _package_git_state() -> dict:
    """git_state of this posbias's checkout, read once per process: the code a process runs is what
    was on disk when it began, so a commit made while it trains (a long experiment grid) is not
    the code of its later runs."""
    return git_state(Path(__file__).resolve().parents[1])


def git_state(repo: Path) -> dict:
    """`git_commit` (HEAD) and `git_dirty` (tracked files changed since it) of the checkout at
    `repo`; {} when `repo` holds no .git (an installed package: git would otherwise walk up and
    report whatever repository the environment happens to sit in) or git cannot say.

    `safe.directory` names this one checkout: a checkout owned by another user (a container's
    mount, a copied tree) otherwise fails git's ownership check, and the commit went unrecorded.
    That lifts nothing new: whoever controls `repo` already controls the code being imported.
    """
    repo = Path(repo)
    if not (repo / ".git").exists():
        return {}
    git = ["git", "-c", f"safe.directory={repo}", "-C", str(repo)]
    try:
        head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        if head.returncode != 0:
            return {}
        out = {"git_commit": head.stdout.strip()}
        status = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                text=True, timeout=10)
        if status.returncode == 0:
            out["git_dirty"] = bool(status.stdout.strip())
        return out
    except (OSError, subprocess.SubprocessError):
        return {}


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")

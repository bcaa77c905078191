"""Output folders: where posbias may write, and what it may delete there.

One mechanism for every command that writes a folder (train, evaluate, predict, diagnose, export,
data build / stats, explain, experiment run / copy / report):

- a name that becomes part of a path (an experiment's method, dataset or eval-set name, `--name`)
  is one plain path component (`safe_name`), and the path built from it stays inside its output
  folder (`inside`): a method named `/abs/path` or `../../x` is refused before anything is written;
- posbias never writes or deletes through a symbolic link at a name it writes (`<out>.tmp`,
  `<out>.old`, `best.tmp`, `checkpoints/last.tmp`, ...): `no_link` refuses it;
- every folder posbias creates holds a marker, `.posbias-output` (a small JSON: which posbias, which
  command, when). An existing non-empty folder without it is the user's and is refused
  (`check_ours`), never replaced. Folders written by posbias before the marker existed are accepted
  when they hold one file only posbias writes, read and recognised (`recognised`, the narrow rule):
  `run_info.json` naming a posbias version (train, evaluate, predict, diagnose),
  `experiment.sqlite` (an experiment's store), `stats.json` of a `data build` or
  `data stats` (its keys), `report.json` of an experiment report, or `attention.json` of `explain`;
- one writer at a time per folder (`output_lock`): an OS lock (flock, as an experiment's run locks)
  on `.<name>.posbias-lock` beside the folder. Beside, not inside: evaluate's outputs replace the
  folder whole (`staged_output`), and a lock file inside would be swapped out with it. The lock
  file goes when its holder lets go; a killed holder's file is taken over (the kernel dropped its lock);
- a kill between `replace_dir`'s two renames leaves the result only in `<out>.tmp` or `<out>.old`:
  `restore` puts it back on the next run, under the lock;
- a command whose outputs are one set (evaluate, predict, diagnose, data build / stats) writes them
  into `<out>.tmp` and then replaces the folder whole (`staged_output`): a kill mid-write leaves
  the previous set as it was, never a mix.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import socket
from pathlib import Path

from .errors import ConfigError, PosbiasError
from .limits import load_json
from .utils import atomic_write_json, now_iso, recover_dir, replace_dir
from .version import __version__

try:
    import fcntl
except ImportError:  # Windows: no flock; folders are then not locked (see output_lock)
    fcntl = None

MARKER = ".posbias-output"
MAX_NAME = 128
_OURS_PREFIX = ".posbias-"  # the marker, training's write probes: not the user's files


def one_process(command: str) -> None:
    """Refuse `posbias <command>` started as one of several processes (torchrun, `accelerate
    launch`: WORLD_SIZE > 1). Only `train` splits its work over processes; any other command would
    run whole in every process, each writing the same output folder."""
    world = os.environ.get("WORLD_SIZE", "1").strip()
    if world.isdigit() and int(world) > 1:
        raise ConfigError(f"posbias {command} runs in one process, but it was started as one of {world} "
                          f"(WORLD_SIZE={world}: torchrun or accelerate launch), and every process would write "
                          f"the same output folder; run it without the launcher (pick its GPU with --device cuda:N)")


def safe_name(name, what: str) -> str:
    """`name` if it is one plain path component, else a ConfigError naming `what`.

    A name from a spec or the command line becomes a folder or file name: a `/` or `\\` would nest
    it (or, absolute, put it anywhere), `..` climb out, a leading `-` read as an option in printed
    commands and `~` as a home folder in a shell; NUL and control characters make paths that cannot
    be written or printed.
    """
    if not isinstance(name, str):
        raise ConfigError(f"{what} must be a string, got {name!r}")
    if not name or name in (".", ".."):
        raise ConfigError(f"{what} {name!r} is not a usable name: it becomes a folder or file name")
    bad = next((c for c in name if c in "/\\" or ord(c) < 32 or ord(c) == 127), None)
    if bad is not None:
        raise ConfigError(f"{what} {name!r} holds {bad!r}: it becomes a folder or file name, so it must be "
                          "one path component (no '/', '\\' or control characters)")
    if name[0] in "-~":
        raise ConfigError(f"{what} {name!r} starts with {name[0]!r}: it becomes a folder or file name; "
                          "start it with a letter or digit")
    if len(name) > MAX_NAME:
        raise ConfigError(f"{what} {name[:40]!r}... is {len(name)} characters long: it becomes a folder or "
                          f"file name, at most {MAX_NAME}")
    return name


def inside(base, path, what: str) -> Path:
    """`path` resolved (links followed), checked to lie inside `base` (resolved): where posbias is
    about to write must be where the user asked for outputs."""
    root, target = Path(base).resolve(), Path(path).resolve()
    if target != root and root not in target.parents:
        raise ConfigError(f"{what}: {path} resolves to {target}, outside the output folder {root}")
    return target


def no_link(path, what: str) -> Path:
    """`path`, refused when it is a symbolic link: a link where posbias writes or deletes would send
    its files (or its rmtree) into another folder."""
    path = Path(path)
    if path.is_symlink():
        raise ConfigError(f"{what}: {path} is a symbolic link (to {os.readlink(path)}); posbias writes and "
                          "deletes only its own files there, never through a link: remove the link")
    return path


def remove_dir(path, what: str) -> None:
    """Delete a folder posbias wrote (a `.tmp` or `.old` copy), never through a link at its name."""
    path = no_link(path, what)
    if path.exists():
        shutil.rmtree(path)


def fresh_dir(path, what: str) -> Path:
    """An empty folder at `path` (a staging `.tmp`): what a killed run left there is deleted, a link refused."""
    remove_dir(path, what)
    path = Path(path)
    path.mkdir(parents=True)
    return path


# ----------------------------------------------------------------------------------- the marker
def write_marker(folder, command: str) -> None:
    """`.posbias-output` in `folder`: posbias wrote it (version, command, time)."""
    folder = Path(folder)
    no_link(folder / MARKER, command)
    atomic_write_json(folder / MARKER, {"written_by": "posbias", "version": __version__, "command": command,
                                        "created": now_iso()})


def is_marked(folder) -> bool:
    m = Path(folder) / MARKER
    return m.is_file() and not m.is_symlink()


def _json_value(path: Path, limit: int = 64 << 20):
    """The JSON value in `path`, or None (missing, a link, too large, not JSON)."""
    if path.is_symlink() or not path.is_file():
        return None
    try:
        return load_json(path, "an output file", limit)
    except (PosbiasError, OSError):
        return None


def _json_object(path: Path):
    obj = _json_value(path)
    return obj if isinstance(obj, dict) else None


def recognised(folder) -> bool:
    """Whether a folder without the marker was written by an earlier posbias (the narrow rule in the
    module docstring): one file only posbias writes, with the content posbias gives it."""
    folder = Path(folder)
    info = _json_object(folder / "run_info.json")
    if info is not None and isinstance(info.get("versions"), dict) and isinstance(info["versions"].get("posbias"), str):
        return True
    db = folder / "experiment.sqlite"
    if db.is_file() and not db.is_symlink():  # a damaged store is still one: its reader names the damage
        return True
    stats = _json_value(folder / "stats.json")
    if isinstance(stats, dict) and "sentence_splitter" in stats and "splits" in stats:  # data build
        return True
    if isinstance(stats, list) and stats and all(isinstance(s, dict) and {"path", "sentences", "scheme"} <= set(s)
                                                 for s in stats):  # tagging data stats
        return True
    report = _json_object(folder / "report.json")
    if report is not None and "rows" in report and "position_bias" in report:
        return True
    attention = _json_object(folder / "attention.json")
    return attention is not None and "attention" in attention and "tokens" in attention


def user_entries(folder) -> list[str]:
    """Names in `folder` other than posbias's own hidden files (marker, write probes)."""
    return sorted(x.name for x in Path(folder).iterdir()  # (atomic_write's temporary name for the marker: "..")
                  if not x.name.startswith(_OURS_PREFIX) and not x.name.startswith("." + _OURS_PREFIX))


def check_ours(folder, what: str) -> None:
    """Refuse an existing non-empty folder posbias did not write (no marker, not recognised)."""
    folder = Path(folder)
    if not folder.exists():
        return
    if not folder.is_dir():
        raise ConfigError(f"{what} {folder} is an existing file, not a folder")
    if is_marked(folder) or not user_entries(folder) or recognised(folder):
        return
    raise ConfigError(f"{what} {folder}: the output folder holds {user_entries(folder)[0]!r}, which posbias did "
                      f"not write (no {MARKER} marker); posbias writes only into a new, empty or its own folder")


def claim_folder(folder, what: str) -> Path:
    """`folder` (resolved) checked to be ours (`check_ours`), created and marked."""
    folder = Path(folder).resolve()
    check_ours(folder, what)
    folder.mkdir(parents=True, exist_ok=True)
    if not is_marked(folder):
        write_marker(folder, what)
    return folder


# ------------------------------------------------------------------------------------ the lock
def lock_file(folder) -> Path:
    folder = Path(folder).resolve()
    return folder.with_name(f".{folder.name}.posbias-lock")


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
        return f"pid {info['pid']} on {info['host']} (since {info['since']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


def take_lock(folder, what: str) -> int | None:
    """Take `folder`'s writer lock without waiting: its descriptor (for `let_go`), or a ConfigError
    naming the folder and the holder. None where the OS has no flock (Windows)."""
    if fcntl is None:
        return None
    path = lock_file(folder)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a file where a parent folder should be: mkdir says "File exists"
        why = os.strerror(errno.ENOTDIR) if isinstance(e, FileExistsError) else e.strerror or e
        raise ConfigError(f"{folder}: cannot create the output folder ({why})") from None
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o666)
        except OSError as e:
            raise ConfigError(f"{what} {folder}: cannot create its lock file {path} "
                              f"({e.strerror or e})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConfigError(f"{what} {folder} is being written by {_holder(path)}; wait for it to finish "
                              "or choose another folder") from None
        except BaseException:
            os.close(fd)
            raise
        try:  # the file we locked must still be the one at `path` (a holder removes it when done)
            same = os.path.samestat(os.fstat(fd), os.stat(path, follow_symlinks=False))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": now_iso()}).encode())
    return fd


def let_go(folder, fd: int | None) -> None:
    """Release a lock from `take_lock`: the file is removed while still held, then closed."""
    if fd is None:
        return
    with contextlib.suppress(OSError):
        os.unlink(lock_file(folder))
    os.close(fd)


@contextlib.contextmanager
def output_lock(folder, what: str, *, hold: bool = True):
    """Hold `folder`'s writer lock for the block. `hold=False` (another process of a distributed
    run holds it) takes none."""
    fd = take_lock(folder, what) if hold else None
    try:
        yield
    finally:
        let_go(folder, fd)


@contextlib.contextmanager
def output_folder(folder, what: str, *, hold: bool = True):
    """Write in place into `folder` (train, explain, report): locked, checked to be ours, created
    and marked; yields its resolved path."""
    folder = Path(folder).resolve()
    with output_lock(folder, what, hold=hold):
        yield claim_folder(folder, what) if hold else (check_ours(folder, what) or folder)


def restore(final, what: str) -> None:
    """Finish a `replace_dir(<final>.tmp, final)` a kill interrupted between its renames (call it
    holding the lock): with `final` gone, a complete `<final>.tmp` (marked: the marker is written
    last) takes its place, else `<final>.old` (a complete earlier output). `.old` is then removed."""
    final = Path(final)
    for suffix in (".tmp", ".old"):  # never moved or deleted through a link
        no_link(final.with_name(final.name + suffix), what)
    old = final.with_name(final.name + ".old")
    if not final.exists() and not final.is_symlink():
        if not recover_dir(final, MARKER) and old.is_dir() and recognised(old):
            os.replace(old, final)  # an earlier version's output: no marker to go by
    if final.is_dir() and old.exists():
        remove_dir(old, what)


# What evaluate / predict / diagnose write into an output folder. An existing folder holding only
# these (a previous output) is replaced whole; one holding anything else is the user's, and refused.
OUTPUT_NAMES = frozenset({
    "predictions.json", "nbest.json", "null_odds.json", "metrics.json", "predictions.conll", "predictions.jsonl",
    "config.yaml", "run_info.json", "eval", "diagnosis.md", "diagnosis.html", "diagnosis.json",
    "f1_by_position.png", "position_updates.png", "position_curves.png", "per_class.png", "length_density.png",
    "class_positions.png"})


@contextlib.contextmanager
def staged_output(output_dir, names=OUTPUT_NAMES, what: str = "--output-dir"):
    """Yield a fresh `<output_dir>.tmp` folder to write a command's outputs into; when the block
    ends normally it replaces `output_dir` whole (`replace_dir`, as training's `eval/`), so a run
    killed mid-write leaves the previous outputs as they were, never a mix. None yields None.

    `names`: what the command writes. The folder must be new, empty or posbias's own (its marker,
    `check_ours`) and hold nothing but `names`: anything else is the user's, and refused,
    never replaced. One writer at a time (`output_lock`), so two evaluations into one folder
    never mix; a result a kill left only in `.tmp`/`.old` is restored first (`restore`).
    """
    if output_dir is None:
        yield None
        return
    final = Path(output_dir).resolve()  # a symlinked folder: its target is replaced, the link kept
    if final.exists() and not final.is_dir():
        raise ConfigError(f"{output_dir}: the output folder is an existing file; give a folder path")
    if final == Path.cwd().resolve() or final in Path.cwd().resolve().parents:
        raise ConfigError(f"{output_dir}: the output folder holds the working folder; give a new folder")
    with output_lock(final, what):
        restore(final, what)
        if final.is_dir():
            foreign = [x for x in user_entries(final) if x not in names
                       and not (x.startswith(".") and x.endswith(".tmp"))]  # atomic_write leftovers
            if foreign:
                raise ConfigError(f"{output_dir}: the output folder holds {foreign[0]!r}, which posbias did not "
                                  "write; outputs replace the folder whole, so give a new or empty folder")
        check_ours(final, what)  # only names posbias writes, but not written by posbias
        tmp = final.with_name(final.name + ".tmp")
        try:
            fresh_dir(tmp, what)  # what a killed run left there goes; a link is refused
        except OSError as e:
            raise ConfigError(f"{output_dir}: cannot create the output folder ({e.strerror or e})") from None
        try:
            yield tmp
            write_marker(tmp, what)  # last: a marked .tmp is complete (`restore`)
            replace_dir(tmp, final)
        except BaseException:
            if not tmp.is_symlink():
                shutil.rmtree(tmp, ignore_errors=True)
            raise


def check_not_input(folder, inputs, what: str) -> None:
    """Refuse an output folder that holds (or whose `.tmp`/`.old` holds) one of the command's
    inputs: replacing the folder would delete the file being read (`data build --input D/x.json
    --out D`). Compared as resolved paths (links followed) and, for each file already in the
    folder, as files (`os.path.samefile`: a hard link)."""
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    final = Path(folder).resolve()
    trees = [final, final.with_name(final.name + ".tmp"), final.with_name(final.name + ".old")]
    existing = [x for t in trees if t.is_dir() for x in t.iterdir()]
    for item in inputs:
        src = Path(str(item)).resolve()
        held = any(src == t or t in src.parents for t in trees)
        if not held and src.is_file():
            held = any(_same(src, x) for x in existing)
        if held:
            raise ConfigError(f"{what} {folder} holds the input {item}: writing the outputs there would "
                              "replace it; choose another folder")


def _same(a: Path, b: Path) -> bool:
    try:
        return b.is_file() and os.path.samefile(a, b)
    except OSError:
        return False

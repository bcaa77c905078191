"""The experiment store, `<output_dir>/experiment.sqlite` (its schema, opening it for reading or for
writing, refusing a file that is not one), and the runs' locks, `<output_dir>/locks/<run>.lock`.

Sharing a store. Any number of `experiment run` processes on one folder of one machine split the grid
between them (filling idle cores or GPUs):
- a process trains a run only while it holds the run's lock, `<output_dir>/locks/<run>.lock`, an OS
  lock (flock; a locked byte on Windows) taken without waiting; a run another process holds is left
  to it, and once its own pass is done a process waits for those (unless `wait=False`, `--no-wait`);
- the kernel drops a lock when its process ends, however it ends, so the run of a crashed (killed,
  out-of-memory) process is free again: the next process to find it resumes it from its last
  checkpoint. A process that hangs keeps its lock: end it (its pid is in the lock file);
- after taking a lock a process reads the run's record again (another may have finished it), and
  records through WAL + BEGIN IMMEDIATE transactions, so writers queue instead of failing.
Across machines, cluster jobs (`run_experiment(record=False)`, the commands `--dry-run` prints) hold
their run's lock but leave the store to one `collect_experiment` process (SQLite is not to be shared
over a network file system; flock is, on NFS v4 and Lustre mounted with `-o flock`); or give each
machine a disjoint `--only` and join their stores with `experiment copy`. A store SQLite cannot read gives a ConfigError
naming it: move it aside and run again; finished runs are re-collected from their folders (their last
checkpoint is complete, so nothing trains again).
"""
from __future__ import annotations

import json
import os
import socket
import sqlite3
import time
from contextlib import closing, contextmanager
from pathlib import Path

from .. import outputs
from ..errors import ConfigError
from ..utils import now_iso

try:
    import fcntl
except ImportError:  # Windows: a locked byte instead of flock; both end with their process
    fcntl = None
    import msvcrt

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    name TEXT PRIMARY KEY, method TEXT, seed INTEGER, dataset TEXT, train_size INTEGER,
    config_hash TEXT, config_json TEXT, output_dir TEXT, status TEXT,
    started TEXT, finished TEXT, wall_seconds REAL, train_seconds REAL,
    metrics_json TEXT, versions_json TEXT
);
CREATE TABLE IF NOT EXISTS segments (
    run TEXT, eval_set TEXT, segmenter TEXT, segment TEXT, n INTEGER, exact REAL, f1 REAL,
    PRIMARY KEY (run, eval_set, segmenter, segment)
);
-- Per-example scores. QA: one row per question, its (EM, F1). Tagging: one row per sentence, the
-- (numerator, denominator) of the main metric in (exact, f1), so that sums give the corpus value.
CREATE TABLE IF NOT EXISTS question_scores (
    run TEXT, eval_set TEXT, qid TEXT, exact REAL, f1 REAL, PRIMARY KEY (run, eval_set, qid)
);
-- Per-run series: `loss` and `val_<metric>` by training step; `position_updates` by position id (step
-- column): the fraction of optimizer steps in which that position embedding got a gradient.
CREATE TABLE IF NOT EXISTS curves (
    run TEXT, kind TEXT, step INTEGER, value REAL, PRIMARY KEY (run, kind, step)
);
-- Tagging's duplicated-test-set evaluation of a run, per eval set: every (k, α) cell's per-sentence
-- counts and where each copy sits (a compressed NumPy archive of integer arrays, read without pickle:
-- `posbias.tagging.duplicated.load_copy_scores`), so that F1(α) can be split by sentence.
CREATE TABLE IF NOT EXISTS copy_scores (
    run TEXT, eval_set TEXT, data BLOB, PRIMARY KEY (run, eval_set)
);
"""
OPTIONAL_TABLES = frozenset({"copy_scores"})
"""Tables a store recorded before they existed lacks: read as empty; `connect` adds them."""


STORE_WAY_OUT = ("move it aside (with its -wal and -shm files) and run `posbias experiment run` again: finished "
                 "runs are re-collected from their folders without training; or restore an archive with "
                 "`posbias experiment copy`")


@contextmanager
def readable_store(db_path):
    """A store SQLite cannot read ('file is not a database', 'database disk image is malformed')
    becomes a ConfigError naming the file and the way out; one it cannot open or write now (a
    read-only folder, a full disk, locked for a minute) a ConfigError naming the file."""
    try:
        yield
    except sqlite3.DatabaseError as e:
        if isinstance(e, sqlite3.OperationalError):  # cannot open, locked, disk full: the file may be fine
            raise ConfigError(f"{db_path}: {' '.join(str(e).split())} (SQLite)") from None
        if type(e) is not sqlite3.DatabaseError:  # a constraint, ...: not a damaged file
            raise
        raise ConfigError(f"{db_path} is not a readable experiment store ({e}); {STORE_WAY_OUT}") from None


def check_store(conn, db_path, *, new_ok: bool = False) -> None:
    """Refuse a SQLite file that is not a posbias store (another program's database, or one whose
    tables lack posbias's columns) before anything reads or writes it; `new_ok`: an empty database
    (a store being created) is fine."""
    with closing(sqlite3.connect(":memory:")) as ours:
        ours.executescript(SCHEMA)
        want = {t: {c[1] for c in ours.execute(f"PRAGMA table_info({t})")}
                for (t,) in ours.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    have = {t for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not have and new_ok:
        return
    for table in ("runs", *sorted(set(want) - {"runs"})):
        if table not in have:
            if table != "runs" and (new_ok or table in OPTIONAL_TABLES):  # an older store: `connect` adds it
                continue
            why = f"it has no {table} table" + (f" (its tables: {', '.join(sorted(have)[:5])})" if have else "")
        elif missing := sorted(want[table] - {c[1] for c in conn.execute(f"PRAGMA table_info({table})")}):
            why = f"its {table} table has no {missing[0]} column"
        elif extra := [c[1] for c in conn.execute(f"PRAGMA table_info({table})")
                       if c[1] not in want[table] and c[3] and c[4] is None and not c[5]]:
            # a column posbias never fills that refuses rows without it: a run would train, then fail to record
            why = (f"its {table} table has a column {extra[0]!r} that posbias does not write and that may not be "
                   "empty (NOT NULL without a default): the store was edited")
        else:
            continue
        raise ConfigError(f"{db_path} is not a posbias experiment store: {why}; {STORE_WAY_OUT}")


def open_for_reading(db_path) -> sqlite3.Connection:
    """The store, for reading (a report, the source of a copy). In a folder this process cannot
    write (an archive on a read-only disk, a colleague's folder) SQLite cannot create the -shm file
    that WAL mode needs; a store there with no -wal file (its writers closed) holds everything in
    the main file and is read as immutable."""
    conn = None
    try:
        conn = sqlite3.connect(str(db_path), timeout=60)
        conn.execute("SELECT 1 FROM sqlite_master LIMIT 1")
        return conn
    except BaseException as e:
        if conn is not None:
            conn.close()
        if (not isinstance(e, sqlite3.OperationalError) or os.access(Path(db_path).parent, os.W_OK)
                or Path(f"{db_path}-wal").exists()):
            raise
    return sqlite3.connect(f"{Path(db_path).resolve().as_uri()}?immutable=1", uri=True)


def connect(db_path) -> sqlite3.Connection:
    """The store, shared by every process of the folder: WAL (readers such as a report never block a
    writing run), a 60 s busy timeout, and BEGIN IMMEDIATE for each `with conn:` write transaction, so
    that writers queue for the lock at the start instead of failing halfway."""
    Path(db_path).parent.mkdir(parents=True, exist_ok=True)
    with readable_store(db_path):
        conn = sqlite3.connect(str(db_path), timeout=60, isolation_level="IMMEDIATE")
    try:
        with readable_store(db_path):
            check_store(conn, db_path, new_ok=True)  # before WAL: another program's file stays untouched
            for attempt in range(100):
                # Switching to WAL needs the file alone for a moment; a process opening the store
                # while another switches it may get 'database is locked' without waiting: retry.
                try:
                    conn.execute("PRAGMA journal_mode=WAL")
                    break
                except sqlite3.OperationalError as e:
                    if "locked" not in str(e) or attempt == 99:
                        raise
                    time.sleep(0.1)
            conn.executescript(SCHEMA)
    except BaseException:
        conn.close()
        raise
    return conn


def lock_path(exp_dir, run_name: str) -> Path:
    return Path(exp_dir) / "locks" / f"{run_name}.lock"


def claim(exp_dir, run_name: str) -> int | None:
    """Take a run's lock without waiting: its file descriptor (pass it to `release`), or None when
    another live process holds it. The lock is the OS's, so it ends with the holder's process however
    that ends; the holder's pid, host and start time go into the file, for messages only."""
    path = lock_path(exp_dir, run_name)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not outputs.is_marked(exp_dir):  # a process sharing the folder may claim before this one marks it
        outputs.write_marker(exp_dir, "experiment run")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        taken = _try_lock(fd)
    except BaseException:
        os.close(fd)
        raise
    if not taken:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": now_iso()}).encode())
    return fd


def _try_lock(fd: int) -> bool:
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # held; any other OSError (a file system without locks) is raised
            return False
        return True
    os.lseek(fd, 0, os.SEEK_SET)
    try:
        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
    except OSError:
        return False
    return True


def release(fd: int) -> None:
    os.ftruncate(fd, 0)  # no holder; closing (here, or the kernel at exit) ends the lock
    os.close(fd)


def lock_fds(lock: int | None) -> tuple[int, ...]:
    """The `pass_fds` by which a child process shares a run's lock (`claim`): a flock belongs to the
    open file, which the child inherits; the locked byte of Windows cannot be passed on."""
    return (lock,) if lock is not None and fcntl is not None else ()


def holder(exp_dir, run_name: str) -> str:
    """Who holds a run's lock, as its lock file says: "pid 123 on host (since ...)"."""
    try:
        info = json.loads(lock_path(exp_dir, run_name).read_text(encoding="utf-8"))
        return f"pid {info['pid']} on {info['host']} (since {info['since']})"
    except (OSError, ValueError, KeyError, TypeError):  # being written, or unreadable while locked (Windows)
        return "another process"


def run_status(conn, name: str) -> tuple[str | None, str | None]:
    row = conn.execute("SELECT status, config_hash FROM runs WHERE name = ?", (name,)).fetchone()
    return (row[0], row[1]) if row else (None, None)


def grid_running(exp_dir) -> bool:
    """Whether a live process holds one of the folder's run locks (`claim`): a grid runs there."""
    for path in sorted((Path(exp_dir) / "locks").rglob("*.lock")):
        if path.is_symlink() or not path.is_file():
            continue
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:
            continue
        try:
            if not _try_lock(fd):
                return True
        finally:
            os.close(fd)  # closing ends the lock taken to look
    return False

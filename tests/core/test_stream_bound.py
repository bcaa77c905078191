"""One byte bound for every input, counted while it streams (`limits.read_bytes`): stdin as a pipe or
a socket, and a named FIFO, are refused with one line naming the input and the bound as soon as more
than `POSBIAS_MAX_FILE_BYTES` have come, holding one buffer of at most the bound; and small piped
input reads exactly as the same file does, even where a command reads its data twice (tagging
sniffs the format first)."""
import json
import os
import socket
import subprocess
import threading
import time
import tracemalloc

import pytest
import torch

from posbias.checkpoint import save_checkpoint
from posbias.config import RESOURCES, build_config
from posbias.errors import DataError
from posbias.limits import DATA_LIMIT_ENV, MIB, read_bytes
from posbias.records import read_text

from helpers import BIN, CPU_ONLY_ENV, tiny_config

BOUND = 16 * MIB
# What may pass the bound before the refusal: the chunk being read (1 MiB) and what the pipe or
# socket buffers hold.
SLACK = 4 * MIB
TOO_BIG = f"larger than the 16 MiB limit for data file (raise it with {DATA_LIMIT_ENV}=<bytes>)"
CONLL = RESOURCES / "tagging_demo" / "wnut-dev.conll.gz"


def posbias(*args, stdin) -> subprocess.Popen:
    """`posbias -q ARGS` reading `stdin`, with the 16 MiB bound."""
    return subprocess.Popen([str(BIN / "posbias"), "-q", *map(str, args)], stdin=stdin, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **CPU_ONLY_ENV,
                                 DATA_LIMIT_ENV: str(BOUND)})


class Feed(threading.Thread):
    """Writes spaces with `write` until the reader goes away (or `total` bytes), like `yes ' '`;
    `sent`: the bytes written, final once the thread is joined."""

    def __init__(self, write, total: int | None = None):
        super().__init__(daemon=True)
        self.write, self.total, self.sent = write, total, 0
        self.start()

    def run(self):
        block = b" " * 65536
        try:
            while self.total is None or self.sent < self.total:
                self.write(block)
                self.sent += len(block)
        except OSError:  # BrokenPipeError, ConnectionResetError: the reader stopped
            pass

    def total_sent(self) -> int:
        self.join(timeout=60)
        return self.sent


def finished(proc: subprocess.Popen, timeout: int = 120) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny random QA checkpoint, untrained."""
    from posbias.qa.model import build_model
    from posbias.tasks import get_task

    root = tmp_path_factory.mktemp("ckpt") / "qa"
    torch.manual_seed(0)
    cfg = build_config(tiny_config())
    tokenizer = get_task("qa").load_tokenizer(cfg)
    save_checkpoint(build_model(cfg.model, tokenizer, null_answer=False), cfg, tokenizer, root)
    return root


def refused(proc: subprocess.Popen, feed: Feed) -> tuple[int, str, int]:
    """(exit code, stderr, bytes written before the reader went away) of a command fed by `feed`."""
    code, _, err = finished(proc)
    return code, err, feed.total_sent()


def test_an_endless_pipe_on_stdin_stops_at_the_bound(checkpoint):
    """`yes ' ' | posbias evaluate qa --data /dev/stdin`, with a 16 MiB bound."""
    t = time.monotonic()
    r, w = os.pipe()
    proc = posbias("evaluate", "qa", "--model", checkpoint, "--data", "/dev/stdin", stdin=r)
    os.close(r)
    code, err, sent = refused(proc, Feed(lambda b: os.write(w, b)))
    os.close(w)
    assert code == 2 and err == f"posbias: error: /dev/stdin: {TOO_BIG}\n", err[-2000:]
    assert BOUND < sent <= BOUND + SLACK  # it stopped reading at the bound
    assert time.monotonic() - t < 60  # seconds (the model's load, then 16 MiB), not minutes


def test_a_100_mb_pipe_stays_under_the_bound():
    r, w = os.pipe()
    proc = posbias("data", "stats", "--data", "/dev/stdin", stdin=r)
    os.close(r)
    code, err, sent = refused(proc, Feed(lambda b: os.write(w, b), total=100 * 10**6))
    os.close(w)
    assert code == 2 and err == f"posbias: error: /dev/stdin: {TOO_BIG}\n", err[-2000:]
    assert sent <= BOUND + SLACK  # 100 MB offered, the bound read


def test_an_endless_fifo_stops_at_the_bound(tmp_path):
    """A named FIFO given to `posbias data stats`."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    proc = posbias("data", "stats", "--data", fifo, stdin=subprocess.DEVNULL)
    with open(fifo, "wb", buffering=0) as f:  # blocks until posbias opens it for reading
        code, err, sent = refused(proc, Feed(f.write))
    assert code == 2 and err == f"posbias: error: {fifo}: {TOO_BIG}\n", err[-2000:]
    assert BOUND < sent <= BOUND + SLACK


def test_a_socket_on_stdin_is_read_under_the_same_bound():
    """A socket cannot be opened by name (/dev/stdin gave 'No such device or address'): it is read
    through the descriptor, counted like a pipe."""
    ours, theirs = socket.socketpair()
    proc = posbias("data", "stats", "--data", "/dev/stdin", stdin=theirs)
    theirs.close()
    code, err, sent = refused(proc, Feed(ours.sendall))
    ours.close()
    assert code == 2 and err == f"posbias: error: /dev/stdin: {TOO_BIG}\n", err[-2000:]
    assert BOUND < sent <= BOUND + SLACK


def _file_stats() -> str:
    proc = posbias("data", "stats", "--data", CONLL, stdin=subprocess.DEVNULL)
    code, out, err = finished(proc)
    assert code == 0, err[-2000:]
    return out


def test_small_tagging_data_through_a_pipe_or_socket_reads_as_the_file():
    """`data stats` reads its file twice (the format is sniffed first): a stream is read once and its
    text kept, so the second read neither comes back empty nor waits for a new writer."""
    expected = _file_stats()
    data = CONLL.read_bytes()  # gzip, piped as it is: gunzipped by its magic bytes
    r, w = os.pipe()
    proc = posbias("data", "stats", "--data", "/dev/stdin", stdin=r)
    os.close(r)
    threading.Thread(target=lambda: (os.write(w, data), os.close(w)), daemon=True).start()
    code, out, err = finished(proc)
    assert code == 0 and err == "", err[-2000:]
    assert out == expected.replace(str(CONLL), "/dev/stdin")

    ours, theirs = socket.socketpair()
    proc = posbias("data", "stats", "--data", "/dev/stdin", stdin=theirs)
    theirs.close()
    ours.sendall(data)
    ours.close()
    code, out, err = finished(proc)
    assert code == 0 and out == expected.replace(str(CONLL), "/dev/stdin"), err[-2000:]


def test_a_small_squad_json_on_stdin_evaluates_as_the_file(tmp_path, checkpoint):
    from posbias.qa.readers import read_qa

    examples = read_qa(RESOURCES / "squad_demo" / "dev.json.gz").examples[:6]
    data = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": e.context, "qas": [
        {"id": e.id, "question": e.question,
         "answers": [{"text": a.text, "answer_start": a.start} for a in e.answers]}]}]} for e in examples]}
    path = tmp_path / "small.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    code, out, err = finished(posbias("evaluate", "qa", "--model", checkpoint, "--data", path, "--output-dir",
                                         tmp_path / "file", "--json", stdin=subprocess.DEVNULL))
    assert code == 0, err[-2000:]
    from_file = json.loads(out)

    r, w = os.pipe()  # what `cat small.json |` gives
    proc = posbias("evaluate", "qa", "--model", checkpoint, "--data", "/dev/stdin", "--output-dir", tmp_path / "pipe",
                   "--json", stdin=r)
    os.close(r)
    threading.Thread(target=lambda: (os.write(w, path.read_bytes()), os.close(w)), daemon=True).start()
    code, out, err = finished(proc)
    assert code == 0, err[-2000:]
    assert json.loads(out) == from_file and from_file["total"] == 6
    predictions = [(tmp_path / name / "predictions.json").read_bytes() for name in ("pipe", "file")]
    assert predictions[0] == predictions[1]


def test_a_stream_is_read_into_one_buffer_and_once(tmp_path, monkeypatch):
    """Just under the bound, a stream is held once (no chunks joined into a second copy); a second
    read of the same FIFO gives the same text at once instead of waiting for a new writer."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    size = BOUND - MIB

    def write(payload: bytes):
        with open(fifo, "wb") as f:
            f.write(payload)

    threading.Thread(target=write, args=(b"x" * size,), daemon=True).start()
    tracemalloc.start()
    try:
        raw = read_bytes(fifo, "data file", BOUND, data=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(raw) == size and raw[:1] == b"x"
    # One buffer (grown with ~1/8 to spare) and the chunk in flight: ~19 MiB; chunks joined at the
    # end held it twice (30 MiB).
    assert peak < 1.5 * size, f"{peak / MIB:.1f} MiB for a {size / MIB:.0f} MiB stream"
    del raw

    monkeypatch.setenv(DATA_LIMIT_ENV, str(BOUND))
    threading.Thread(target=write, args=(b"-DOCSTART- O\n\nAda B-person\n",), daemon=True).start()
    first = read_text(fifo)
    t = time.monotonic()
    assert read_text(fifo) == first == "-DOCSTART- O\n\nAda B-person\n"
    assert time.monotonic() - t < 1  # no second open: a FIFO without a writer would block here


def test_a_socket_named_as_a_file_is_refused_in_one_line(tmp_path):
    path = tmp_path / "data.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    try:
        with pytest.raises(DataError, match=r"data\.sock: is a socket, not a data file: give a regular file, or "
                                            r"pipe the data to stdin$"):
            read_text(path)
    finally:
        server.close()

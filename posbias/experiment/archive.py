"""`copy_results`: the finished runs' results (not their checkpoints) copied from one experiment folder
into another, to archive a grid next to its report, restore it into a working folder, or join the
stores of machines that each ran a part of it (`posbias experiment copy`).
"""
from __future__ import annotations

from contextlib import closing
from pathlib import Path

from .. import outputs
from ..errors import ConfigError
from ..utils import atomic_write_text
from .collect import position_update_curve
from .store import OPTIONAL_TABLES, check_store, connect, grid_running, open_for_reading, readable_store


def copy_results(src_dir, dest_dir, *, force: bool = False) -> dict:
    """Copy the finished runs' results (not their checkpoints) of one experiment folder into another.

    Archives a grid's results next to its report (a few MB instead of GBs of checkpoints), restores
    them into a working folder (where `experiment run` then skips those runs), or joins the stores
    of machines that each ran a part of a grid with `--only`. A run finished in both with a different
    config hash is refused unless `force`. The copy is one write transaction on the destination's
    store (`connect`: the store's lock, as a recording run takes it), merged into the records there:
    a grid running in the destination meanwhile waits for it and loses no record, and an
    interruption leaves the store as it was. The source's experiment.yaml replaces the destination's
    ("spec": "copied", "replaced", None when equal or absent), except while a grid runs there
    ("kept": its runner owns the spec).
    """
    src_dir, dest_dir = Path(src_dir), Path(dest_dir)
    src_db = src_dir / "experiment.sqlite"
    if not src_db.is_file():
        raise ConfigError(f"{src_dir} holds no experiment.sqlite (run `posbias experiment run` first)")
    if src_dir.resolve() == dest_dir.resolve():
        raise ConfigError(f"experiment copy: source and destination are the same folder ({src_dir})")
    outputs.claim_folder(dest_dir, "experiment copy: destination")
    dest_db = outputs.no_link(dest_dir / "experiment.sqlite", "experiment copy")
    with closing(connect(dest_db)) as work, readable_store(dest_db), \
            readable_store(src_db), closing(open_for_reading(src_db)) as src:
        check_store(src, src_db)
        present = {t for (t,) in src.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        source_optional = sorted(OPTIONAL_TABLES & present)  # what an older source store lacks stays empty
        with work:  # BEGIN IMMEDIATE: the destination store's write lock, for the whole copy
            finished = src.execute("SELECT * FROM runs WHERE status = 'finished' ORDER BY name").fetchall()
            columns = [c[0] for c in src.execute("SELECT * FROM runs LIMIT 0").description]
            conflicts = []
            for row in finished:
                name, h = row[0], row[columns.index("config_hash")]
                old = work.execute("SELECT status, config_hash FROM runs WHERE name = ?", (name,)).fetchone()
                if old and old[0] == "finished" and old[1] != h:
                    conflicts.append(name)
            if conflicts and not force:
                raise ConfigError(f"experiment copy: run {conflicts[0]} is finished in both {src_dir} and {dest_dir} "
                                  f"with different configs ({len(conflicts)} run(s) in all); pass --force to "
                                  "replace the destination's")
            for row in finished:
                work.execute("DELETE FROM runs WHERE name = ?", (row[0],))
                work.execute(f"INSERT INTO runs ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})", row)
                for table in ("segments", "question_scores", "curves", *source_optional):
                    work.execute(f"DELETE FROM {table} WHERE run = ?", (row[0],))
                    rows = src.execute(f"SELECT * FROM {table} WHERE run = ?", (row[0],)).fetchall()
                    if rows:
                        work.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(rows[0]))})", rows)
                # A run recorded before the store kept position updates: take them from its folder
                # while it is still there.
                if not work.execute("SELECT 1 FROM curves WHERE run = ? AND kind = 'position_updates' LIMIT 1",
                                    (row[0],)).fetchone():
                    out = row[columns.index("output_dir")]
                    points = position_update_curve(Path(out) / "position_updates.json") if out else {}
                    work.executemany("INSERT INTO curves VALUES (?, ?, ?, ?)",
                                     [(row[0], kind, step, value) for (kind, step), value in points.items()])
    # The source's spec comes along, as `experiment run` rewrites a folder's spec on every run: an
    # archive refreshed while its grid grows (an arm added) then names the new arms too.
    spec_src, spec_dest, spec = src_dir / "experiment.yaml", dest_dir / "experiment.yaml", None
    if spec_src.is_file():
        text = spec_src.read_text(encoding="utf-8")
        if not spec_dest.is_file():
            spec = "copied"
        elif spec_dest.read_text(encoding="utf-8") != text:
            spec = "kept" if grid_running(dest_dir) else "replaced"
        if spec in ("copied", "replaced"):
            atomic_write_text(spec_dest, text)
    return {"source": str(src_dir), "destination": str(dest_dir), "copied": [r[0] for r in finished],
            "replaced": conflicts, "spec": spec}

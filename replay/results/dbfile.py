"""The DuckDB file as the store sees it before DuckDB opens it: `check_db_file` (a --db that is a
folder, empty, SQLite or not DuckDB is refused in one line), `remove_db`, and the store's errors.
No DuckDB import: the command line checks --db and reports store errors without loading DuckDB
(`kvcap replay` loads it in its writer thread, replay/results/writer.py). replay/results/store.py
re-exports all of it.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

DEFAULT_DB = "kvcap.duckdb"


class StoreError(ValueError):
    """The database cannot be used or written: one line naming the file, what is wrong, the fix."""


class StoreLocked(StoreError, RuntimeError):
    """Another process holds the DuckDB file."""


class WriteInterrupted(KeyboardInterrupt):
    """Ctrl-C while a run was being written; `committed` says whether it was (the message must
    tell the truth: an interrupt during COMMIT is deferred until the COMMIT is done)."""

    def __init__(self, path: str | Path, *, committed: bool) -> None:
        super().__init__(f"{path}: the run was {'written' if committed else 'not written'}")
        self.path, self.committed = str(path), committed


_DUCKDB_MAGIC = b"DUCK"       # bytes 8..12 of every DuckDB database file
_SQLITE_MAGIC = b"SQLite format 3\x00"


def check_db_file(path: str | Path, *, must_exist: bool) -> None:
    """Refuse, before DuckDB opens it, a --db that is not a DuckDB database (or is missing when
    it is only read)."""
    p = Path(path)
    if p.is_dir():
        raise StoreError(f"database {p} is a directory; pass a file path such as {p / DEFAULT_DB}")
    if p.is_symlink() and not p.exists():
        raise StoreError(f"database {p} is a symbolic link to {os.readlink(p)}, which does not exist; "
                         "pass the target path itself (kvcap does not create a database through a link)")
    try:
        mode = os.stat(p).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise StoreError(f"database {p}: cannot read it ({exc.strerror or exc})") from None
    if mode is not None and not stat.S_ISREG(mode):
        # Opening a FIFO blocks until someone writes to it; a device is no database either.
        raise StoreError(f"database {p} is {_kind(mode)}, not a DuckDB file; pass a file path")
    if not p.exists():
        if must_exist:
            raise StoreError(f"{p}: no such database; write it first with --db (`kvcap replay`, "
                             "`kvcap logs`) or check the path")
        if not p.parent.is_dir():
            raise StoreError(f"database {p}: folder {p.parent} does not exist; create it first")
        return
    try:
        with p.open("rb") as fh:
            head = fh.read(16)
    except OSError as exc:
        raise StoreError(f"database {p}: cannot read it ({exc.strerror or exc})") from None
    if not head:
        raise StoreError(f"database {p} is empty (0 bytes), not a DuckDB database; delete it or "
                         "pass another --db")
    if head.startswith(_SQLITE_MAGIC):
        raise StoreError(f"database {p} is a SQLite file, not a DuckDB database; pass another --db")
    if head[8:12] != _DUCKDB_MAGIC:
        raise StoreError(f"database {p} is not a DuckDB database file; pass another --db")
    _check_length(p)


# DuckDB's storage layout starts with a 4 KiB file header and two 4 KiB database headers.
_HEADERS_END = 3 * 4096


def _check_length(p: Path) -> None:
    """Refuse a file cut short before its blocks even start (store.py checks the blocks)."""
    try:
        size = p.stat().st_size
    except OSError:
        return
    if size < _HEADERS_END:
        raise StoreError(truncated(p, size, _HEADERS_END))


def truncated(p: str | Path, size: int, want: int) -> str:
    return (f"database {p} is truncated ({size:,} bytes, its data reaches byte {want:,}); "
            "restore it from a copy or pass another --db")


def _kind(mode: int) -> str:
    from traces.atomic import file_kind
    return file_kind(mode)


def remove_db(path: str | Path) -> None:
    for p in (Path(path), Path(f"{path}.wal")):
        try:
            p.unlink(missing_ok=True)
        except OSError:
            pass

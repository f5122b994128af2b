"""Atomic output files: write to a temp file in the destination's folder, then rename over it.

A failure (disk full, Ctrl-C, a bug) leaves the destination as it was and removes the temp file.
The result gets the permissions an ordinary `open(path, "w")` would give (0666 minus the umask),
not the 0600 of `tempfile.mkstemp`. Standard library only: replay's calibrate (on a GPU machine
without polars) and capacity use it too. Must not import replay/ or capacity/.
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yields a temp path next to `path`; on a clean exit it becomes `path` (rename)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        # Name the file the user asked for (a failed write() names none, or the temp file).
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)

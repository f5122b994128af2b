"""Atomic output files: write to a temp file in the destination's folder, then rename over it.

A failure (disk full, Ctrl-C, a bug) leaves the destination as it was and removes the temp file.
The result gets the permissions an ordinary `open(path, "w")` would give (0666 minus the umask),
not the 0600 of `tempfile.mkstemp`. Standard library only: replay's calibrate (on a GPU machine
without polars) and capacity use it too. Must not import replay/ or capacity/.

`check_output` is the one guard every output path passes (the CLI before any work, `atomic_path`
again just before the rename): a rename replaces whatever the name points at, so the target must be
absent or a regular file — never a symbolic link (the link, not its target, would be replaced), a
device node, a FIFO or a socket (a rename turns `/dev/full` into a regular file), never one of the
command's inputs, and its extension must not name a format other than the one written.
"""
from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path


class OutputRefused(ValueError):
    """An output path kvcap will not write; the message is one line naming the path and the fix."""


# What each kind of output is, by the extensions that name it. An extension listed under another
# kind is refused (`trace synth -o x.csv` would put Parquet bytes under a CSV name); an extension
# listed nowhere (or none) is accepted.
FORMATS: dict[str, tuple[str, ...]] = {
    "Parquet": (".parquet", ".pq"),
    "CSV": (".csv", ".tsv"),
    "JSON": (".json", ".jsonl", ".ndjson"),
    "YAML": (".yml", ".yaml"),
    "HTML": (".html", ".htm"),
    "PNG": (".png",),
    "SVG": (".svg",),
    "DuckDB": (".duckdb", ".db"),
    "text": (".txt", ".log", ".prom"),
}


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words (from its st_mode)."""
    for test, what in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a folder")):
        if test(mode):
            return what
    return "not a regular file"


def check_output(path: str | Path, *, flag: str = "-o", fmt: str | None = None,
                 inputs: Iterable[str | Path | None] = ()) -> None:
    """Refuse (OutputRefused) an output `path` that a temp-file rename must not replace: a
    symbolic link, anything but a regular file, one of `inputs`, or an extension that names a
    format other than `fmt` (a key of FORMATS)."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise OutputRefused(f"{flag} {path}: cannot be checked ({exc.strerror or exc})") from None
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            raise OutputRefused(f"{flag} {path}: is a symbolic link (to {os.readlink(path)}); "
                                "kvcap replaces only regular files: pass the target itself")
        if not stat.S_ISREG(st.st_mode):
            raise OutputRefused(f"{flag} {path}: is {file_kind(st.st_mode)}; kvcap writes regular "
                                "files only (it never replaces a device, pipe or socket)")
        for src in inputs:
            if src is not None and _same(path, Path(src)):
                raise OutputRefused(f"{flag} {path}: is also the input {src}; writing it would "
                                    "destroy the input: pass another output file")
    if fmt is not None:
        suffix = path.suffix.lower()
        for other, suffixes in FORMATS.items():
            if other != fmt and suffix in suffixes:
                want = " or ".join(FORMATS.get(fmt, ())) or "no"
                raise OutputRefused(f"{flag} {path}: the extension {suffix} names {other}, but this "
                                    f"writes {fmt}: use a {want} extension")


def _same(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yields a temp path next to `path`; on a clean exit it becomes `path` (rename). `path` must
    be absent or a regular file (check_output), checked before the write and again before the
    rename."""
    path = Path(path)
    check_output(path, flag="cannot write")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        check_output(path, flag="cannot write")   # it may have been replaced meanwhile
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        # Name the file the user asked for (a failed write() names none, or the temp file).
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_files(files: dict) -> None:
    """Several files (path -> text or bytes), all or none: every one is written to a temp file
    first (a full disk stops here, and no file is replaced), then each is renamed into place."""
    staged: list[tuple[Path, Path]] = []
    try:
        for path, data in files.items():
            path = Path(path)
            check_output(path, flag="cannot write")
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            os.close(fd)
            staged.append((Path(tmp), path))
            try:
                if isinstance(data, bytes):
                    Path(tmp).write_bytes(data)
                else:
                    Path(tmp).write_text(data, encoding="utf-8")
            except OSError as exc:
                raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None
            os.chmod(tmp, 0o666 & ~_umask())
        for tmp, path in staged:
            check_output(path, flag="cannot write")
            os.replace(tmp, path)
    finally:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)


def write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)

"""`kvcap replay`'s DuckDB write, done by a thread while the run replays: one transaction per run
as `store.write_run` writes it (DESIGN §6), started early and fed as the run goes.

The thread imports DuckDB, opens the file and begins the transaction while the trace's engine
loop runs (the compiled cores release the GIL while they step), deletes the earlier run of the
same id once `begin_run` names it, appends each chunk of steps and TBT samples the core hands
over (`append`, the core's sink: replay/engine/compiled.py `run`), and on `commit(tables)` appends
the other tables and commits. On a 2-core machine most of the write then overlaps the replay.

Same guarantees as `write_run`: all of the run or none of it; a failure rolls back and removes
a file this write created; its error (`StoreError` with DuckDB's reason, `StoreLocked`) is
raised in the caller's thread, by the next `append` (the replay stops) or by `commit`. Ctrl-C
while writing aborts the transaction; during COMMIT it waits for the COMMIT, and
`WriteInterrupted.committed` tells which. Leaving the `with` block without a commit (the replay
failed or was interrupted) aborts it.

Imports no DuckDB itself (the thread does: replay/results/store.py), so `kvcap replay` does not wait
for that import before it replays.
"""
from __future__ import annotations

import queue
import threading
from pathlib import Path

import numpy as np
import polars as pl

from replay.results.dbfile import WriteInterrupted

# Chunks waiting for the thread at most: a replay that outruns DuckDB waits (memory bounded).
MAX_PENDING = 4
# Each chunk is inserted as it comes, on one DuckDB thread: a single-threaded INSERT appends
# to the transaction's one row-group collection, which writes each row group (122,880 rows) as
# it fills, so chunks smaller than a row group cost no more and make the same file. (With
# DuckDB's default threads, each INSERT is a batch insert of its own collections: appends of
# 65,536 steps cost the write 1.5-2x its CPU and made the file up to 60% larger, so they had to
# wait until a whole row group had come.) What is left after the loop is then one chunk and
# the COMMIT: Mooncake's 119k steps, less than one row group, were all inserted after it.
WRITE_THREADS = 1
# DuckDB's memory limit for the write. Written blocks stay cached up to it, and a streamed write
# lives as long as the replay, whose memory it adds to: at 512 MB (store.WRITE_MEMORY_LIMIT) the
# 10x Azure conv process peaked at 600-640 MB, at 64 MB at ~500 MB (written blocks are evicted
# for free; the write ~5% slower).
MEMORY_LIMIT = "64MB"


class RunWriter:
    def __init__(self, path: str | Path) -> None:
        self.path = path
        self._jobs: queue.Queue = queue.Queue(maxsize=MAX_PENDING)
        self._lock = threading.Lock()          # orders an abort against the start of COMMIT
        self._aborting = False
        self._committing = False
        self._committed = False
        self._commit_asked = False
        self._failure: BaseException | None = None
        self._write = None                      # store.RunWrite, once the thread made it
        self._rows = {"steps": 0, "tbt": 0}     # rows handed over so far (numbers the steps)
        self._streamed = False
        # Set when the thread ends. Waited on instead of Thread.join(): a Ctrl-C that interrupts
        # join() on CPython 3.11 can mark a thread that still runs as stopped (its state lock is
        # released on its behalf), so join() would return before the COMMIT is done.
        self._done = threading.Event()
        # Started by the first job (`begin_run`, just before the engine loop, which releases
        # the GIL): started earlier, its import of DuckDB and the caller's numpy and polars
        # calls would take turns at the GIL, each waiting up to the switch interval.
        self._thread = threading.Thread(target=self._work, name="kvcap-store-writer",
                                        daemon=True)

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """Without a commit (the replay failed or was interrupted) the write is aborted. Ctrl-C
        after `commit` was asked for says whether the COMMIT was done."""
        self.close()
        if isinstance(exc, KeyboardInterrupt) and not isinstance(exc, WriteInterrupted) \
                and self._commit_asked:
            raise WriteInterrupted(self.path, committed=self._committed) from None

    # ------------------------------------------------------------------ the caller's side
    def begin_run(self, run_id: str) -> None:
        """The run's id (its earlier rows are deleted first): before any `append`."""
        self._put(("run", run_id))

    def append(self, steps: dict[str, np.ndarray], tbt: dict[str, np.ndarray]) -> None:
        """One chunk of the run's step and TBT columns (STEP_COLUMNS, TBT_COLUMNS), in order."""
        self._streamed = True
        self._put(("chunk", steps, tbt))

    def commit(self, tables: dict) -> None:
        """Hand over the run's tables: the thread appends those not appended already (all of
        them when nothing was) and commits, while the caller goes on (`wait`)."""
        self._put(("commit", tables))
        self._commit_asked = True

    def wait(self) -> None:
        """Until the run is committed; raises the write's error, or `WriteInterrupted` on
        Ctrl-C (`committed`: whether the COMMIT was done)."""
        try:
            self._done.wait()
        except KeyboardInterrupt:
            self._abort()
            raise WriteInterrupted(self.path, committed=self._committed) from None
        if self._failure is not None:
            raise self._failure
        if not self._committed:
            raise RuntimeError("the store writer ended without a commit")

    def close(self) -> None:
        """Abort the write unless it committed, and wait for the thread to end."""
        if self._thread.ident is not None and not self._done.is_set():
            self._abort()

    def _put(self, job: tuple) -> None:
        if self._thread.ident is None:
            self._thread.start()
        while True:
            if self._failure is not None:
                raise self._failure
            if self._done.is_set():
                raise RuntimeError("the store writer has ended")
            try:
                self._jobs.put(job, timeout=0.05)
                return
            except queue.Full:
                continue

    def _abort(self) -> None:
        with self._lock:
            if not self._committing:
                self._aborting = True
                con = self._write.con if self._write is not None else None
                if con is not None:
                    try:
                        con.interrupt()             # stops an append under way
                    except Exception:               # noqa: BLE001 - closed meanwhile: done
                        pass
        try:
            self._jobs.put_nowait(("abort",))
        except queue.Full:
            pass                                    # the thread sees _aborting between jobs
        while True:
            try:
                self._done.wait()
                return
            except KeyboardInterrupt:               # the abort is under way: it ends shortly
                continue

    # ------------------------------------------------------------------ the thread
    def _work(self) -> None:
        write = None
        try:
            from replay.results import store, tables   # DuckDB's import, off the caller's thread
            write = self._write = store.RunWrite(self.path, memory_limit=MEMORY_LIMIT,
                                                 threads=WRITE_THREADS)
            write.open()
            run_id, job = None, None
            while True:
                job = job if job is not None else self._jobs.get()
                if self._aborting or job[0] == "abort":
                    raise KeyboardInterrupt
                if job[0] == "run":
                    run_id, job = job[1], None
                    write.delete_run(run_id)
                elif job[0] == "chunk":
                    # With the chunks that came meanwhile, one INSERT per table: an INSERT
                    # costs ~4 ms besides its rows, so a core that outruns the write makes
                    # fewer of them, and what is left after the loop is still one chunk.
                    chunks, job = [job], None
                    while job is None and not self._jobs.empty():
                        job = self._jobs.get()
                        if job[0] == "chunk":
                            chunks.append(job)
                            job = None
                    self._insert(write, tables, chunks, run_id)
                else:
                    self._finish(write, store, job[1], run_id)
                    return
        except BaseException as e:                  # noqa: B036 - handed to the caller
            self._failure = write.failed(e) if write is not None else e
        finally:
            if write is not None:
                write.close()
            self._done.set()

    def _insert(self, write, tables, chunks: list[tuple], run_id: str | None) -> None:
        """Append chunks of step and TBT columns, each table's in one INSERT."""
        for i, table in ((1, "steps"), (2, "tbt")):
            frames = []
            for chunk in chunks:
                start = self._rows[table]
                self._rows[table] += len(next(iter(chunk[i].values())))
                if self._rows[table] > start:
                    frames.append(tables.chunk_frame(chunk[i], start, numbered=table == "steps"))
            if frames:
                write.append(table, pl.concat(frames, rechunk=False) if len(frames) > 1
                             else frames[0], run_id=run_id)

    def _finish(self, write, store, tables: dict, run_id: str | None) -> None:
        table_run_id = tables["runs"]["run_id"][0]
        if run_id is None:                          # nothing streamed: a plain write
            write.delete_run(table_run_id)
        elif run_id != table_run_id:
            raise RuntimeError(f"store writer: run {table_run_id} committed, {run_id} begun")
        streamed = ("steps", "tbt") if self._streamed else ()
        for table in streamed:
            if tables[table].height != self._rows[table]:
                raise RuntimeError(f"store writer: {self._rows[table]} {table} rows appended, "
                                   f"the run has {tables[table].height}")
        store.check_int32(tables)
        write.append_tables(tables, skip=streamed)
        with self._lock:
            if self._aborting:
                raise KeyboardInterrupt
            self._committing = True
        write.commit()
        self._committed = True

"""The index over the run ledger, so that read commands read only the runs they show.

The run records `state/runs/<run-id>.json` stay the committed truth; `state/index/runs.idx`
summarises them and is rebuilt from them whenever it is missing, stale or damaged. It is
gitignored: `runbook init` writes the entry, and the directory carries its own `.gitignore`
(`*`), so a repository made before the index existed does not see it either.

What it keeps, for every `*.json` in state/runs/: the file's signature (size, mtime_ns,
ctime_ns, inode, device, following a link as reading does), a digest of its bytes, and either
what readers select runs by (run id, plan, phase, start, end, verdict) or why the file is not a
readable run record (as `ledger.load_runs` words it). Derived from those: each phase's latest
run per plan, and each metric's latest value per plan (the brief's headline). Whole records
are read from their JSON files only for the runs a command shows, so every field a record
carries reaches its readers whatever the index summarises.

Never disagreeing with the records:
- every `LedgerIndex.open` lists state/runs/ and stats every `*.json`; a file that is new, gone,
  or whose signature differs from the indexed one is read again, whoever changed it: runbook,
  an editor writing in place, `git checkout` or a merge (they write new files: new inode and
  ctime, whatever mtime they set; ctime cannot be set back by hand);
- a file whose timestamps lie within RACY_NS of when it was indexed could change again without
  a new signature on a file system with a coarse clock, so it is "racy": its bytes are hashed
  and compared again on every open until it is older (as git does for its own index);
- the file is written whole to a temp file and renamed over the old one: a reader sees the old
  index or the new one; two processes refreshing at once both write a complete index and the
  later rename wins (the next open checks it against the records like any other);
- a file that is short, of another format, or whose checksum does not match is rebuilt from the
  records, never trusted: the checksums are keyed with a secret of the user's (`_key`), so an
  index runbook did not write here (copied, committed, crafted) is never unmarshalled either;
  a state directory that cannot be written is read without saving an index (the summary lives
  in memory for that command).

Cost (docs/benchmarks.md): an unchanged ledger of 10,000 records costs one listing of state/runs/
and 10,000 stats plus reading the index's head, about 45 ms of CPU on the 2-core benchmark machine;
each changed record costs one read and one validation (a cold build of 10,000: about 1.3 s).
The run folders seen by the listing tell where a run without a record keeps its live state
(`unrecorded_dirs`), so nobody looks into 10,000 finished runs' folders.
"""

from __future__ import annotations

import contextlib
import hashlib
import marshal
import os
import re
import struct
import time
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

from runbook.files import NotReadable, open_regular, read_bounded
from runbook.formatting import parse_utc_precise
from runbook.model import RunRecord
from runbook.store.ledger import parse_run, read_record_bytes, runs_dir, unreadable_text

__all__ = ["INDEX_DIR", "INDEX_NAME", "LAST_REF", "LedgerIndex", "Row", "find_run", "index_path", "pick_rows"]

INDEX_DIR = "index"  # under the state directory
INDEX_NAME = "runs.idx"
RACY_NS = 2_000_000_000  # a file changed this close to its indexing is hashed again on every open
RACY_PROMOTE = 16  # rewrite the index once this many racy files have become old enough to trust

_FORMAT = 4
_MAGIC = b"RBLEDGR" + bytes([_FORMAT]) + struct.pack("<H", marshal.version)
_SECTIONS = ("head", "rows", "metrics")
_HEADER = struct.Struct("<" + "Q16s" * len(_SECTIONS))


class Row(NamedTuple):
    """A readable run record as the index summarises it."""

    name: str  # file name in state/runs/
    digest: bytes  # blake2b-128 of the file's bytes
    run_id: str
    plan: str
    phase: str
    started: str
    moment: int | None  # `finished or started` as UTC epoch seconds (`formatting.parse_utc`); None: no time
    verdict: str
    start_s: int | None  # `started` as UTC epoch seconds; None: not a time
    trial: bool  # a sweep's trial (`runbook sweep`): listed, never a phase's latest run


# the stored forms (marshal-able): a Row as a plain tuple, the head, the metrics of each file
RawRow = tuple[Any, ...]
Head = dict[str, Any]
FileMetrics = dict[str, Any]


def index_path(state_dir: str | os.PathLike[str]) -> Path:
    return Path(state_dir) / INDEX_DIR / INDEX_NAME


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


_KEY: bytes | None = None


def _key() -> bytes:
    """This user's secret for the index's checksums ($XDG_CACHE_HOME/runbook/index.key, made on
    first use): an index file runbook did not write here (copied, committed by someone, crafted)
    fails its checksum and is rebuilt from the records, never unmarshalled. Empty when no cache
    directory can be written (the checksums still catch damage)."""
    global _KEY
    if _KEY is None:
        _KEY = b""
        try:
            base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
            path = Path(base) / "runbook" / "index.key"
            if not path.is_file():
                path.parent.mkdir(parents=True, exist_ok=True)
                with contextlib.suppress(FileExistsError):
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                    with os.fdopen(fd, "wb") as handle:
                        handle.write(os.urandom(32))
            key = read_bounded(path, 64)
            _KEY = key if len(key) == 32 else b""
        except (OSError, RuntimeError, NotReadable):  # no home, a read-only one, a FIFO there
            pass
    return _KEY


def _sealed(data: bytes) -> bytes:
    """A section's checksum: keyed with `_key()`."""
    return hashlib.blake2b(data, digest_size=16, key=_key()).digest()


def _order(row: RawRow) -> tuple[str, str, str]:
    return (row[5], row[2], row[0])  # (started, run_id, file name): ledger.load_runs's order


# ---- the directory as it is now ------------------------------------------------------------------

Sig = tuple[int, int, int, int, int]


def _scan(folder: Path, dirs: list[str] | None = None) -> dict[str, Sig | None]:
    """Every `*.json` entry of `folder` -> its signature (None: it cannot be stat'ed); the names of
    its subdirectories (the runs' log folders) go to `dirs`."""
    names = []
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                name = entry.name
                if name.endswith(".json"):
                    names.append(name)
                elif dirs is not None and entry.is_dir():
                    dirs.append(name)
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    out: dict[str, Sig | None] = {}
    try:
        stat = os.stat
        for name in names:
            try:
                s = stat(name, dir_fd=fd)
            except OSError:
                out[name] = None
                continue
            out[name] = (s.st_size, s.st_mtime_ns, s.st_ctime_ns, s.st_ino, s.st_dev)
    finally:
        os.close(fd)
    return out


# ---- reading one record into the index ---------------------------------------------------------


class _Read(NamedTuple):
    row: RawRow | None  # a Row as a plain tuple, when the record is readable
    metrics: FileMetrics | None  # its merged metrics without the per-step copies
    error: str | None  # why not (the first line of the exception)
    volatile: bool  # an OSError: tried again on every open, never cached
    digest: bytes


def _read_one(folder: Path, name: str) -> _Read:
    from pydantic import ValidationError

    from runbook.store.ledger import first_line

    try:
        data = read_record_bytes(folder / name)
    except (OSError, ValueError) as exc:
        return _Read(None, None, first_line(exc), isinstance(exc, OSError), b"")
    digest = _digest(data)
    try:
        record = parse_run(data)
    except (ValueError, ValidationError) as exc:
        return _Read(None, None, first_line(exc), False, digest)
    return _Read(_summary(name, digest, record), _top_metrics(record), None, False, digest)


def _summary(name: str, digest: bytes, record: RunRecord) -> RawRow:
    from runbook.formatting import parse_utc

    return (name, digest, record.run_id, record.plan, record.phase, record.started,
            _epoch(parse_utc(record.finished or record.started)), record.verdict, _epoch(parse_utc(record.started)),
            record.trial is not None)


def _epoch(moment: datetime | None) -> int | None:
    return int(moment.timestamp()) if moment is not None else None


def _ended_after(record: RunRecord, moment: float) -> bool:
    """Whether `record` ended (or, unended, started) after `moment`, at its record's own precision."""
    when = parse_utc_precise(record.finished or record.started)
    return when is not None and when.timestamp() > moment


def _top_metrics(record: RunRecord) -> FileMetrics:
    from runbook.contract import top_metrics

    return top_metrics(record.metrics)


# ---- the stored index ----------------------------------------------------------------------------


class _Stored:
    """An index file as read: the head at once, the rows and metrics sections when asked for (read
    from the same open file, so a newer index renamed into place meanwhile cannot mix in)."""

    def __init__(self, handle: BinaryIO, fields: tuple[Any, ...]) -> None:
        self._handle = handle
        self._fields = fields
        self.head: Head = {}
        self._rows: list[RawRow] | None = None
        self._metrics: dict[str, FileMetrics] | None = None

    def __del__(self) -> None:
        self._handle.close()

    @classmethod
    def read(cls, path: Path) -> _Stored | None:
        """The index at `path`, or None when there is none or it cannot be trusted."""
        try:
            handle = open_regular(path)  # kept open for the sections read later
        except (OSError, NotReadable):  # a FIFO there is rebuilt over, never waited on
            return None
        try:
            prefix = handle.read(len(_MAGIC) + _HEADER.size)
            if len(prefix) < len(_MAGIC) + _HEADER.size or not prefix.startswith(_MAGIC):
                raise ValueError("not an index")
            stored = cls(handle, _HEADER.unpack_from(prefix, len(_MAGIC)))
            head = stored._section(0)
            if not isinstance(head, dict) or head.get("format") != _FORMAT:
                raise ValueError("another format")
            stored.head = head
            return stored
        except Exception:  # noqa: BLE001 - a damaged index of any kind is rebuilt, never trusted
            handle.close()
            return None

    def _section(self, index: int) -> Any:
        fields = self._fields
        start = len(_MAGIC) + _HEADER.size + sum(fields[2 * i] for i in range(index))
        length, digest = fields[2 * index], fields[2 * index + 1]
        blob = os.pread(self._handle.fileno(), length, start)
        if len(blob) != length or _sealed(blob) != digest:
            raise ValueError("checksum mismatch")
        return marshal.loads(blob)

    @property
    def rows(self) -> list[RawRow]:
        if self._rows is None:
            self._rows = self._section(1)
        return self._rows

    @property
    def metrics(self) -> dict[str, FileMetrics]:
        if self._metrics is None:
            self._metrics = self._section(2)
        return self._metrics


def _encode(head: Head, rows: list[RawRow], metrics: dict[str, FileMetrics]) -> bytes:
    blobs = [marshal.dumps(head), marshal.dumps(rows), marshal.dumps(metrics)]
    header = []
    for blob in blobs:
        header += [len(blob), _sealed(blob)]
    return _MAGIC + _HEADER.pack(*header) + b"".join(blobs)


# ---- the index as a command sees it -------------------------------------------------------------


class LedgerIndex:
    """The ledger of a state directory, fresh as of `open`: problems, each phase's latest runs,
    rows to page through, metric values, and whole `RunRecord`s loaded for the rows asked for."""

    def __init__(self, state_dir: str | os.PathLike[str], head: Head, stored: _Stored | None,
                 rows: list[RawRow] | None, volatile_errors: dict[str, str]) -> None:
        self.state_dir = Path(state_dir)
        self.folder = runs_dir(state_dir)
        self._head = head
        self._stored = stored
        self._rows = rows
        self._volatile = volatile_errors
        self.saved = False  # whether this open wrote the index file
        self.dirs: list[str] = []  # subdirectories of state/runs/ (run folders) when opened

    # ---- opening ---------------------------------------------------------------------------

    @classmethod
    def open(cls, state_dir: str | os.PathLike[str], *, save: bool = True) -> LedgerIndex:
        """The index of `state_dir`, checked against state/runs/ and brought up to date (and
        saved, unless `save` is False or the directory cannot be written)."""
        folder = runs_dir(state_dir)
        at = time.time_ns()
        dirs: list[str] = []
        listing = _scan(folder, dirs)
        path = index_path(state_dir)
        stored = _Stored.read(path) if listing else None
        view = None
        if stored is not None and stored.head["sigs"] == listing:
            view = cls._check_fast(state_dir, folder, stored, at, save)
        if view is None:
            view = cls._rebuild(state_dir, folder, listing, stored, at, save)
        view.dirs = dirs
        return view

    @classmethod
    def _check_fast(cls, state_dir: str | os.PathLike[str], folder: Path, stored: _Stored, at: int, save: bool) -> LedgerIndex | None:
        """The stored index when no file changed: racy files hashed again, files that could not be
        read tried again. None: something changed after all."""
        head = stored.head
        volatile: dict[str, str] = {}
        for name, error in head["volatile"].items():
            read = _read_one(folder, name)
            if not read.volatile or read.error != error:
                return None
            volatile[name] = error
        racy = head["racy"]
        settled = []
        for name, digest in racy.items():
            try:
                now = _digest(read_record_bytes(folder / name))
            except (OSError, ValueError):  # not a regular file, too big: as when it was indexed
                now = b""
            if now != digest:
                return None
            sig = head["sigs"][name]
            if sig is not None and max(sig[1], sig[2]) < at - RACY_NS:
                settled.append(name)
        view = cls(state_dir, head, stored, None, volatile)
        if save and len(settled) >= RACY_PROMOTE:
            try:
                rows, metrics = stored.rows, stored.metrics
            except Exception:  # noqa: BLE001 - a damaged section: rebuilt from the records
                return None
            head = dict(head, racy={n: d for n, d in racy.items() if n not in settled})
            view._head = head
            view.saved = _save(state_dir, head, rows, metrics)
        return view

    @classmethod
    def _rebuild(cls, state_dir: str | os.PathLike[str], folder: Path, listing: dict[str, Sig | None], stored: _Stored | None,
                 at: int, save: bool) -> LedgerIndex:
        """Read what changed since `stored` (everything without one) and derive the rest."""
        old_sigs: dict[str, Sig | None] = {}
        old_rows: dict[str, RawRow] = {}
        old_metrics: dict[str, FileMetrics] = {}
        old_errors: dict[str, RawRow] = {}
        if stored is not None:
            try:
                old_sigs = stored.head["sigs"]
                old_rows = {row[0]: row for row in stored.rows}
                old_metrics = stored.metrics
                old_errors = {e[0]: e for e in stored.head["errors"]}
            except Exception:  # noqa: BLE001 - a damaged section: read every record again
                old_sigs, old_rows, old_metrics, old_errors = {}, {}, {}, {}
        racy_names = set(stored.head["racy"]) if stored is not None and old_sigs else set()
        rows: list[RawRow] = []
        metrics: dict[str, FileMetrics] = {}
        errors: list[RawRow] = []  # (name, message, digest)
        volatile: dict[str, str] = {}
        racy: dict[str, bytes] = {}
        for name, sig in listing.items():
            same = sig is not None and old_sigs.get(name) == sig and name not in racy_names
            if same and name in old_rows and name in old_metrics:
                rows.append(old_rows[name])
                metrics[name] = old_metrics[name]
                digest = old_rows[name][1]
            elif same and name in old_errors:
                errors.append(old_errors[name])
                digest = old_errors[name][2]
            else:
                read = _read_one(folder, name)
                digest = read.digest
                if read.volatile or (sig is None and read.row is None):
                    volatile[name] = read.error or "cannot be read"
                    continue
                if read.row is not None:
                    rows.append(read.row)
                    metrics[name] = read.metrics or {}  # (set with the row)
                else:
                    errors.append((name, read.error, digest))
            if sig is not None and max(sig[1], sig[2]) >= at - RACY_NS:
                racy[name] = digest
        rows.sort(key=_order)
        errors.sort()
        head = {
            "format": _FORMAT, "sigs": listing, "racy": racy, "volatile": volatile, "errors": errors,
            "ids": [row[2] for row in rows], "latest": _latest(rows), "latest_metrics": _latest_metrics(rows, metrics),
        }
        view = cls(state_dir, head, None, rows, volatile)
        if save and listing:
            view.saved = _save(state_dir, head, rows, metrics)
        return view

    # ---- what readers ask -------------------------------------------------------------------

    @property
    def problems(self) -> list[str]:
        """One line per `*.json` that is not a readable run record, in file-name order, worded as
        `ledger.load_runs` words them."""
        found = [(e[0], e[1]) for e in self._head["errors"]] + list(self._volatile.items())
        return [f"{self.folder / name}: skipped, not a readable run record ({error})" for name, error in sorted(found)]

    def _all_rows(self) -> list[RawRow]:
        if self._rows is None:
            assert self._stored is not None
            try:
                self._rows = self._stored.rows
            except Exception:  # noqa: BLE001 - the rows section is damaged: rebuilt from the records
                fresh = LedgerIndex._rebuild(self.state_dir, self.folder, _scan(self.folder), None, time.time_ns(),
                                             save=True)
                fresh.dirs = self.dirs
                self._head, self._rows, self._volatile = fresh._head, fresh._rows, fresh._volatile
                self.saved = fresh.saved
        assert self._rows is not None
        return self._rows

    def rows(self, plan: str | None = None, phase: str | None = None) -> list[Row]:
        """Readable records (of `plan`, of `phase`), oldest first."""
        return [Row._make(r) for r in self._select(plan, phase)]

    def _select(self, plan: str | None, phase: str | None) -> list[RawRow]:
        rows = self._all_rows()
        if plan is None and phase is None:
            return rows
        return [r for r in rows if (plan is None or r[3] == plan) and (phase is None or r[4] == phase)]

    def run_ids(self) -> set[str]:
        """The run ids of every readable record."""
        return set(self._head["ids"])

    def unrecorded_dirs(self) -> list[str]:
        """Run folders in state/runs/ without a readable record of their run: where a run in progress,
        or one whose runbook died before recording it, keeps its live state (runbook/store/live.py)."""
        ids = self.run_ids()
        return [name for name in self.dirs if name not in ids]

    def latest_rows(self, plan: str) -> list[Row]:
        """The latest run of each phase `plan` has runs of (phases no longer in it too), oldest first;
        a sweep's trials are left out (they never decide a phase by themselves)."""
        return [Row._make(r) for r in self._head["latest"].get(plan, [])]

    def latest_runs(self, plan: str, problems: list[str] | None = None, *,
                    verdicts: frozenset[str] | None = None) -> list[RunRecord]:
        """`latest_rows` as whole records: all that runbook/run/select.py and planstate.py need, since
        where a plan stands depends only on each phase's latest run and their order. With
        `verdicts`: each phase's latest run with one of those verdicts (runbook/plan/crossref.py)."""
        if verdicts is None:
            return self.load(self.latest_rows(plan), problems)
        seen: dict[str, Row] = {}
        for row in reversed(self.rows(plan)):
            if row.verdict in verdicts and row.phase not in seen and not row.trial:
                seen[row.phase] = row
        return self.load(sorted(seen.values(), key=_order), problems)

    def latest_metrics(self, plan: str) -> FileMetrics:
        """Each metric's value in the latest run of `plan` that wrote it (without `step-N.` copies)."""
        return dict(self._head["latest_metrics"].get(plan, {}))

    def load(self, rows: list[Row], problems: list[str] | None = None) -> list[RunRecord]:
        """The records of `rows`, read from their JSON files. A file that stopped being readable
        since the index was checked is skipped (and named in `problems`)."""
        from pydantic import ValidationError

        from runbook.store.ledger import load_run

        out = []
        for row in rows:
            path = self.folder / row.name
            try:
                out.append(load_run(path))
            except (OSError, ValueError, ValidationError) as exc:
                if problems is not None:
                    problems.append(unreadable_text(path, exc))
        return out

    def runs(self, plan: str | None = None, phase: str | None = None, problems: list[str] | None = None,
             *, limit: int | None = None, since: int | None = None) -> tuple[list[RunRecord], int]:
        """Records of `plan` / `phase`, oldest first: those that started at or after `since` (UTC
        epoch seconds), the last `limit` of them (None: all). Returns them and how many matching
        runs were left out."""
        rows = self._select(plan, phase)
        kept = rows if since is None else [r for r in rows if r[8] is not None and r[8] >= since]  # Row.start_s
        if limit is not None and limit < len(kept):
            kept = kept[len(kept) - limit :]
        return self.load([Row._make(r) for r in kept], problems), len(rows) - len(kept)

    def find(self, ref: str, plan: str | None = None) -> RunRecord | None:
        """A run (of `plan`) by a run reference (`pick_rows`); None when none or several match."""
        matches = pick_rows(self.rows(plan), ref)
        found = self.load(matches) if len(matches) == 1 else []
        return found[0] if found else None

    def last(self, plan: str | None = None) -> RunRecord | None:
        """The latest readable run (of `plan`)."""
        return self.find("last", plan)

    def last_since(self, plan: str, phase: str, moment: float) -> RunRecord | None:
        """The latest record of `plan`'s `phase` (in ledger order) that ended after `moment` (UTC epoch
        seconds; or started after it, when it has no end). The index keeps whole seconds, so a run of
        `moment`'s own second is read and judged by its record's own time, to the microsecond."""
        for row in reversed(self.rows(plan, phase)):
            if row.moment is None or row.moment < int(moment):
                continue
            found = self.load([row])
            if found and _ended_after(found[0], moment):
                return found[0]
        return None


LAST_REF = re.compile(r"last(?:~(\d{1,6}))?")  # `last`, `last~N`


def pick_rows(rows: list[Row], ref: str) -> list[Row]:
    """The rows a run reference names among `rows` (ledger order, oldest first): `last`, `last~N`
    (the N-th run before the last), a run id, or a prefix of run ids. One row: found; none: no such
    run; several: the prefix is ambiguous. The one rule of every verb that takes a RUN
    (`Workspace.find_run` words its refusals)."""
    last = LAST_REF.fullmatch(ref)
    if last:
        back = int(last.group(1) or 0)
        return [rows[-1 - back]] if back < len(rows) else []
    return [r for r in rows if r.run_id == ref][:1] or [r for r in rows if r.run_id.startswith(ref)]


def find_run(state_dir: str | os.PathLike[str], ref: str) -> RunRecord | None:
    """A run by id, id prefix, or `last` (through the ledger's index: only that run is read)."""
    return LedgerIndex.open(state_dir).find(ref)


def _latest(rows: list[RawRow]) -> dict[str, list[RawRow]]:
    """plan -> the latest row of each of its phases, oldest first (rows are in ledger order). A
    sweep's trials are not: a phase's verdict is its latest run that is no trial (a chosen trial
    decides through the copy `runbook choose` records)."""
    latest: dict[str, dict[str, tuple[int, RawRow]]] = {}
    for i, row in enumerate(rows):
        if row[9]:  # Row.trial
            continue
        latest.setdefault(row[3], {})[row[4]] = (i, row)
    return {plan: [row for _i, row in sorted(by_phase.values())] for plan, by_phase in latest.items()}


def _latest_metrics(rows: list[RawRow], metrics: dict[str, FileMetrics]) -> dict[str, FileMetrics]:
    out: dict[str, FileMetrics] = {}
    for row in rows:
        if row[9]:  # a trial's numbers are no phase's latest
            continue
        out.setdefault(row[3], {}).update(metrics.get(row[0], {}))
    return out


def _save(state_dir: str | os.PathLike[str], head: Head, rows: list[RawRow], metrics: dict[str, FileMetrics]) -> bool:
    """Write the index (whole, renamed into place); False when the directory cannot be written."""
    from runbook.files import atomic_write_bytes

    path = index_path(state_dir)
    try:
        path.parent.mkdir(exist_ok=True)
        ignore = path.parent / ".gitignore"
        if not ignore.exists():
            atomic_write_bytes(ignore, b"# runbook's index over state/runs/*.json: a cache, never committed\n*\n",
                               durable=False)
        atomic_write_bytes(path, _encode(head, rows, metrics), durable=False)
    except OSError:
        with contextlib.suppress(OSError):
            path.parent.rmdir()  # only when empty: nothing half-made stays behind
        return False
    return True

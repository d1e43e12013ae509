"""Files runbook reads and writes safely: atomic replacement and bounded reads.

Atomic replacement: temp file in the same directory, fsync, rename. A crash or a full disk leaves
either the old file or the new one, never half of one, and no temp file behind. A replaced file keeps
its mode; a new one gets the mode `open()` would give it (0666 less the umask), not the 0600 of the
temp file.

Bounded reads of files that could be anything (a FIFO, a device, a runaway log): every file runbook
reads that a user, a plan or a step controls (plans, notes, config, metrics files, the run lock) goes
through `read_bounded`: it opens without blocking, reads only a regular file, and never more than the
caller's limit. A FIFO cannot hang runbook and `/dev/zero` cannot fill its memory. Files read in
parts (step logs, the ledger index, series files) are opened with `open_regular`: the same check.

Text bound for a record (the plan, the notes, the ledger: UTF-8 files) must be whole characters:
`half_character` finds a lone surrogate (a JSON `\\ud83d` escape without its pair, or a byte that was not
UTF-8 in an argument, a variable or a path), `whole_text` writes such bytes out (`\\xff`).

Ground floor: imports nothing from runbook.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO


class NotReadable(ValueError):
    """Not a regular file, or larger than the limit; the message says which (without the path)."""


def _open_regular_fd(path: str | os.PathLike[str]) -> tuple[int, os.stat_result]:
    """A read-only fd of a regular file and its stat; `NotReadable` at once for anything else (opened
    without blocking: a FIFO with no writer would otherwise wait forever, deaf to SIGTERM)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    if stat.S_ISREG(info.st_mode):
        return fd, info
    os.close(fd)
    mode = info.st_mode
    what = "a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) else "a device or special file"
    raise NotReadable(f"not a regular file ({what})")


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """`open(path, "rb")` for a regular file only. Raises OSError as `open` does, and `NotReadable`
    for a FIFO, device, socket or directory (every file a step or a user can swap for one: step logs,
    the ledger index, series files)."""
    return os.fdopen(_open_regular_fd(path)[0], "rb")


def read_bounded(path: str | os.PathLike[str], max_bytes: int) -> bytes:
    """The bytes of a regular file of at most `max_bytes`.

    Raises OSError (FileNotFoundError, PermissionError, ...) as `open` does, and `NotReadable` for
    a FIFO, device, socket or directory, or a file over the limit.
    """
    fd, info = _open_regular_fd(path)
    try:
        if info.st_size > max_bytes:
            raise NotReadable(f"{info.st_size:,} bytes, more than the {max_bytes:,} runbook reads")
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            total += len(chunk)
            if total > max_bytes:  # it grew while being read
                raise NotReadable(f"more than the {max_bytes:,} bytes runbook reads")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def half_character(text: str) -> str | None:
    """The first lone surrogate in `text` (what JSON's `\\ud83d` escape without its pair decodes to;
    no UTF-8 file can hold it), or None when `text` is whole characters."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return text[exc.start]
    return None


def whole_text(text: str) -> str:
    """`text` as whole characters, for a record: each byte that was not UTF-8 (an argument, a variable or a
    path that Python decoded with surrogateescape: `\\udcff` for 0xff) written `\\xff`, any other lone
    surrogate `\\ud83d`; text that is whole already comes back unchanged."""
    if half_character(text) is None:
        return text
    return "".join(f"\\x{ord(c) - 0xDC00:02x}" if "\udc80" <= c <= "\udcff" else
                   f"\\u{ord(c):04x}" if "\ud800" <= c <= "\udfff" else c for c in text)


def atomic_write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> None:
    """Replace `path` with `text` atomically. Newlines are written exactly as given."""
    atomic_write_bytes(path, text.encode(encoding))


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, durable: bool = True) -> None:
    """Replace `path` with `data` atomically. `durable=False` skips the fsyncs: for a cache whose
    reader checks a checksum (after a power loss the file may be damaged; the reader rebuilds it)."""
    target = Path(path)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        if target.exists():
            os.chmod(tmp_name, target.stat().st_mode & 0o7777)
        else:
            os.chmod(tmp_name, 0o666 & ~_umask())  # what open() would give, not mkstemp's 0600
        os.replace(tmp_name, target)
    except BaseException as exc:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError) and exc.filename is None:
            # name the file the caller wanted to write (a full disk fails in write/flush, nameless)
            raise OSError(exc.errno, exc.strerror or str(exc), str(target)) from exc
        raise
    if durable:
        _fsync_dir(target.parent)


def remove_stale_temps(path: str | os.PathLike[str]) -> None:
    """Remove the temp files a killed `atomic_write_bytes` of `path` left beside it. Call only
    where nobody else can be writing `path` (under runbook's write lock)."""
    target = Path(path)
    for tmp in target.parent.glob(f".{target.name}.*.tmp"):
        tmp.unlink(missing_ok=True)


def _umask() -> int:
    """The process umask, read without changing it where /proc tells it (thread-safe)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)

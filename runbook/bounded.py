"""Bounded reads of files that could be anything: a FIFO, a device, a runaway log.

Every file runbook reads that a user, a plan or a step controls (plans, notes, config, metrics
files, the run lock) goes through `read_bounded`: it opens without blocking, reads only a regular
file, and never more than the caller's limit. A FIFO cannot hang runbook and `/dev/zero` cannot
fill its memory.
"""

from __future__ import annotations

import os
import stat

__all__ = ["NotReadable", "read_bounded"]


class NotReadable(ValueError):
    """Not a regular file, or larger than the limit; the message says which (without the path)."""


def read_bounded(path: str | os.PathLike[str], max_bytes: int) -> bytes:
    """The bytes of a regular file of at most `max_bytes`.

    Raises OSError (FileNotFoundError, PermissionError, ...) as `open` does, and `NotReadable` for
    a FIFO, device, socket or directory, or a file over the limit.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            what = (
                "a FIFO" if stat.S_ISFIFO(info.st_mode)
                else "a directory" if stat.S_ISDIR(info.st_mode)
                else "a device or special file"
            )
            raise NotReadable(f"not a regular file ({what})")
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

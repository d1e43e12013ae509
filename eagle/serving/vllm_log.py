"""What a vLLM log says went wrong: the root-cause line, and a kept copy of the log.

vLLM reports a failed start as a chain: the engine core's own exception (the cause, e.g.
`ValueError: No common block size for 16 ...`), then the API server's wrapper (`RuntimeError:
Engine core initialization failed. See root cause above.`), then the process's exit. The last 40
lines of the log usually hold only the wrapper, so eagle names the first exception line that is not
a wrapper, and keeps the whole log where it says (a server's scratch folder is removed when it
stops). Pure parsing here except `keep_log`.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from pathlib import Path

# `ValueError: msg`, `torch.OutOfMemoryError: msg`, `vllm.x.YError: msg`, after vLLM's prefixes:
# `(EngineCore_DP0 pid=12) ERROR 12-04 07:41:02 [core.py:700] ` (a message's own indentation is kept)
_PREFIX = re.compile(r"^(?:\([^)]*pid=\d+\) ?)?(?:(?:ERROR|WARNING|INFO|CRITICAL|DEBUG) \S+ \S+ \[[^\]]*\] ?)?")
_EXCEPTION = re.compile(r"^((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt)):\s*(.*\S)\s*$")
# wrappers that point elsewhere: never the cause when something else was raised
_WRAPPERS = ("See root cause above", "Engine core initialization failed", "Engine core proc",
             "EngineCore encountered an issue", "APIServer")
# an indented line right after the exception line continues its message (pydantic's "1 validation
# error for ModelConfig" says what was wrong on the next line), unless it is a frame or a pointer
_NOT_CONTINUATION = ("File ", "Traceback", "For further information", "During handling", "The above exception")
_CONTINUATION_LINES, _LINE_CHARS = 2, 240


def _message(raw: str) -> str:
    return _PREFIX.sub("", raw.rstrip())


def root_cause(log_text: str) -> str | None:
    """The first exception line of the log that is not a wrapper ("see root cause above"), with the
    indented lines that continue its message; the first wrapper when there is nothing else; None
    when the log names no exception."""
    lines = log_text.splitlines()
    found: list[str] = []
    for i, raw in enumerate(lines):
        match = _EXCEPTION.match(_message(raw).strip())
        if not match:
            continue
        parts = [match.group(0)[:_LINE_CHARS]]
        for nxt in map(_message, lines[i + 1:i + 1 + _CONTINUATION_LINES]):
            if not nxt[:1].isspace() or not nxt.strip() or nxt.strip().startswith(_NOT_CONTINUATION):
                break
            parts.append(nxt.strip()[:_LINE_CHARS])
        cause = " | ".join(parts)
        if cause not in found:
            found.append(cause)
    causes = [line for line in found if not any(w in line for w in _WRAPPERS)]
    return (causes or found)[0] if found else None


def log_dir() -> Path:
    """Where failed servers' logs are kept: $EAGLE_LOG_DIR, or eagle-vllm-logs in the temp folder."""
    return Path(os.environ.get("EAGLE_LOG_DIR") or Path(tempfile.gettempdir()) / "eagle-vllm-logs")


def keep_log(log_path: Path, name: str) -> Path | None:
    """Copy a server's log out of its scratch folder (removed when the server stops): the kept path,
    or None when there was no log or it could not be copied."""
    if not log_path.is_file():
        return None
    try:
        folder = log_dir()
        folder.mkdir(parents=True, exist_ok=True)
        kept = folder / f"{time.strftime('%Y%m%d-%H%M%S')}-{name}-{os.getpid()}.log"
        shutil.copyfile(log_path, kept)
    except OSError:
        return None
    return kept

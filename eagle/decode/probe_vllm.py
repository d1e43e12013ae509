"""`eagle probe --backend vllm`: the probe through the serving engine, one target resident at a time.

Two 1T-parameter targets cannot sit on 8 GPUs together, and the serving engine is what a drafter
meets in production. So each target runs alone in vLLM's extraction server (serving.extraction), in
turn, and what it computes goes to files; the comparison runs offline:

1. --model: its greedy continuation of each prompt (the text a drafter for it was trained on), then
   the aux-layer states of prompt + continuation, written as `STATES/model/hs_{i}.safetensors`.
   Server stopped.
2. --other: the aux-layer states of the same token ids, `STATES/other/hs_{i}.safetensors`. Stopped.
3. With --draft: --other served with the drafter (serve-bench's spec run, serving.serve_bench.run_one):
   vLLM's own spec-decode counters give the drafter's acceptance on the new target, and the outputs
   (greedy, so --other's own) give the draft vocabulary's coverage of the new target's output.
4. The files compared per aux layer: mean cosine and mean relative norm difference (decode.probe's
   layer_similarity), --model's states the reference.

Every server's start and stop (pid, monotonic times) is in the report; `max_resident` counts the most
targets alive at one moment from them, and each start first checks that the previous server's process
group is gone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from eagle.common import EagleError, note
from eagle.decode.probe import LayerStats, ProbeReport, layer_similarity, vocab_coverage


class ServerRun(BaseModel):
    """One vLLM server the probe started: which target, what for, its pid, when it lived."""

    role: str  # "model", "other" or "other+draft"
    model: str
    pid: int
    started: float  # time.monotonic() before the process was started
    stopped: float  # time.monotonic() after it was stopped and its process group checked
    gone: bool  # no process of its group ran any more when `stopped` was taken


def max_resident(runs: Sequence[ServerRun]) -> int:
    """The most servers alive at one moment, from their [started, stopped] intervals (pure)."""
    events = sorted([(r.started, 1) for r in runs] + [(r.stopped, -1) for r in runs], key=lambda e: (e[0], e[1]))
    alive = most = 0
    for _, step in events:
        alive += step
        most = max(most, alive)
    return most


def group_alive(pgid: int, wait_s: float = 10.0) -> bool:
    """Whether a process of group `pgid` (a server's: it runs in its own session) still runs, waiting up
    to `wait_s` for the last ones to go. Zombies hold no memory and do not count; without /proc, any
    member counts."""
    deadline = time.monotonic() + wait_s
    while True:
        if not _live_members(pgid):
            return False
        if time.monotonic() > deadline:
            return True
        time.sleep(0.2)


def _live_members(pgid: int) -> bool:
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # state, ppid, pgrp, ...
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


@contextlib.contextmanager
def resident(spec: Any, role: str, runs: list[ServerRun], startup_timeout: float, echo: bool) -> Iterator[Any]:
    """Start the server of `spec` alone: refuse while an earlier one's process group lives; record its life."""
    from eagle.serving.server import running_server

    alive = [r for r in runs if group_alive(r.pid)]
    if alive:
        raise EagleError(f"vLLM for {alive[0].model} (pid {alive[0].pid}) is still alive; the probe keeps one "
                         "target resident at a time")
    started = time.monotonic()
    pid = 0
    try:
        with running_server(spec, startup_timeout, echo, prefix=f"eagle-probe-{role}-") as server:
            assert server.proc is not None
            pid = server.proc.pid
            if echo:
                note(f"[{role}] {spec.model} resident (pid {pid})")
            yield server
    finally:
        if pid:
            gone = not group_alive(pid)
            runs.append(ServerRun(role=role, model=str(spec.model), pid=pid, started=started, stopped=time.monotonic(),
                                  gone=gone))


def _capture(server: Any, seqs: Sequence[list[int]], out: Path, num_aux: int, concurrency: int) -> int:
    """Extract `seqs` through a running extraction server into OUT/hs_{i}.safetensors; bytes written."""
    from eagle.data.capture import write_safetensors
    from eagle.serving.extraction import hidden_states_from

    out.mkdir(parents=True, exist_ok=True)
    total = 0
    for pos, hs in hidden_states_from(server, seqs, num_aux, concurrency):
        total += write_safetensors(out / f"hs_{pos}.safetensors", {"hidden_states": hs.contiguous()}, fsync=False)
    return total


def _greedy(server: Any, prompts: Sequence[list[int]], max_new_tokens: int, concurrency: int) -> list[list[int]]:
    from eagle.serving.client import run_prompts

    try:
        results, _ = run_prompts(server.url, prompts, max_new_tokens, concurrency)
    except Exception as exc:  # noqa: BLE001 - a dead server shows up as connection errors: show its log
        raise server.failed(exc) from None
    return [r.output_token_ids for r in results]


def compare_files(a_dir: Path, b_dir: Path, n: int, layer_ids: Sequence[int], hidden: int) -> tuple[list[LayerStats], int]:
    """Per aux layer, token-weighted means of cosine and relative norm difference of b against a."""
    from eagle.common import load_safetensors

    sums = {k: [0.0, 0.0] for k in layer_ids}
    tokens = 0
    for i in range(n):
        a = load_safetensors(a_dir / f"hs_{i}.safetensors")["hidden_states"]
        b = load_safetensors(b_dir / f"hs_{i}.safetensors")["hidden_states"]
        if a.shape != b.shape or a.shape[-1] != hidden:
            raise EagleError(f"hs_{i}: states of shape {list(a.shape)} and {list(b.shape)}; expected [T, L+1, {hidden}]")
        for j, k in enumerate(layer_ids):
            cos, rel = layer_similarity(a[:, j], b[:, j])
            sums[k][0] += cos * a.shape[0]
            sums[k][1] += rel * a.shape[0]
        tokens += a.shape[0]
    return [LayerStats(layer=k, cos_sim=sums[k][0] / tokens, rel_norm_diff=sums[k][1] / tokens) for k in layer_ids], tokens


class VllmProbeReport(ProbeReport):
    servers: list[ServerRun] = []
    max_resident: int = 0
    vllm_drafts: int | None = None
    states_dir: str | None = None  # where the captured states stayed (--keep-states)

    def metrics(self) -> dict[str, float]:
        out = super().metrics() | {"max_resident": float(self.max_resident)}
        if self.vllm_drafts is not None:
            out["vllm_drafts"] = float(self.vllm_drafts)
        return out


def run_probe_vllm(model_dir: Path, other_dir: Path, prompts: list[list[int]], layer_ids: list[int] | None,
                   draft_dir: Path | None, k: int, max_new_tokens: int, dtype: str | None = None,
                   flags: Any = None, concurrency: int = 8, keep_states: Path | None = None,
                   startup_timeout: float = 600.0, echo: bool = True) -> VllmProbeReport:
    """The probe with each target served by vLLM in turn (see the module docstring)."""
    from eagle.decode.draft_infer import read_draft_spec
    from eagle.decode.probe import _check_pair
    from eagle.serving.extraction import extraction_spec
    from eagle.serving.flags import VllmFlags, host_has_cuda
    from eagle.serving.serve_bench import bench_specs
    from eagle.target import check_layer_ids, open_target

    if not prompts:
        raise EagleError("--prompts: no prompts to probe with (the file has no records, or --limit cut them all)", code=2)
    flags = flags or VllmFlags()
    _check_pair(model_dir, other_dir, flags.trusts_remote_code)
    target = open_target(model_dir, flags.trusts_remote_code)
    if draft_dir is not None:
        layer_ids = layer_ids or read_draft_spec(draft_dir, target.num_layers).layer_ids
    ids = sorted(check_layer_ids(layer_ids or target.default_layer_ids(), target.num_layers, "--layer-ids"))
    cuda = host_has_cuda()
    longest = [p + [0] * max_new_tokens for p in prompts]  # sizes the servers' context: prompt + continuation
    root = keep_states or Path(tempfile.mkdtemp(prefix="eagle-probe-states-"))
    runs: list[ServerRun] = []
    try:
        storage = Path(tempfile.mkdtemp(prefix="eagle-probe-connector-"))
        try:
            spec = extraction_spec(model_dir, longest, ids, storage, flags, cuda, concurrency, dtype)
            with resident(spec, "model", runs, startup_timeout, echo) as server:
                base_out = _greedy(server, prompts, max_new_tokens, concurrency)
                seqs = [p + o for p, o in zip(prompts, base_out, strict=True)]
                _capture(server, seqs, root / "model", len(ids), concurrency)
            spec = extraction_spec(other_dir, longest, ids, storage, flags, cuda, concurrency, dtype)
            with resident(spec, "other", runs, startup_timeout, echo) as server:
                _capture(server, seqs, root / "other", len(ids), concurrency)
        finally:
            shutil.rmtree(storage, ignore_errors=True)
        stats, tokens = compare_files(root / "model", root / "other", len(seqs), ids, target.hidden_size)
        report = VllmProbeReport(layers=stats, tokens=tokens, decoder="vllm",
                                 states_dir=str(keep_states) if keep_states else None)
        if draft_dir is not None:
            (_, spec), = bench_specs(str(other_dir), str(draft_dir), k, flags, cuda, max(map(len, prompts)),
                                     max_new_tokens, concurrency, dtype, baseline=False)
            with resident(spec, "other+draft", runs, startup_timeout, echo) as server:
                served_acceptance(report, server, prompts, max_new_tokens, concurrency, draft_dir, base_out)
        report.servers = runs
        report.max_resident = max_resident(runs)
        return report
    finally:
        if keep_states is None:
            shutil.rmtree(root, ignore_errors=True)


def served_acceptance(report: VllmProbeReport, server: Any, prompts: list[list[int]], max_new_tokens: int,
                      concurrency: int, draft_dir: Path, base_out: list[list[int]]) -> None:
    """Fill `report` from a running server of the new target with the drafter: acceptance from vLLM's
    spec-decode counters (serving.client, as serve-bench reads them), and the draft vocabulary's
    coverage of the outputs (greedy: the new target's own) and of --model's greedy outputs."""
    from eagle.drafter.checkpoint import read_drafter
    from eagle.serving.client import acceptance_metrics, spec_counters

    draft_ids = set(read_drafter(draft_dir).draft_token_ids())
    before = spec_counters(server.metrics_text())
    outputs = _greedy(server, prompts, max_new_tokens, concurrency)
    time.sleep(0.5)  # counters are published by the engine's stats loop
    delta = spec_counters(server.metrics_text()).minus(before)
    report.accept_len = acceptance_metrics(delta)["vllm_accept_len"]
    report.vllm_drafts = int(delta.drafts)
    other_out = [t for o in outputs for t in o]
    report.vocab_coverage, report.vocab_coverage_distinct = vocab_coverage(other_out, draft_ids)
    report.base_vocab_coverage = vocab_coverage([t for o in base_out for t in o], draft_ids)[0]

"""The GPU paths, on a real CUDA device (`make test-gpu`; skipped where torch sees no GPU).

One call on the lent GPU machine runs all of it: the capture engine with and without a device
index, extraction files against the CPU's (bf16 tolerance), `eagle train` offline and --online with
shape buckets and no recompiles after warm-up, evaluate and bench on the fast decoder (CUDA graphs),
and DDP across 2 processes (one per GPU, or sharing one GPU over gloo)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HELDOUT = Path(__file__).resolve().parents[1] / "plans" / "data" / "prompts-heldout.jsonl"
pytestmark = pytest.mark.gpu
ENV = {**os.environ, "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _eagle(*args: str, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    res = subprocess.run([sys.executable, "-m", "eagle.cli", *args], capture_output=True, text=True,
                         env={**ENV, **(env or {})}, timeout=timeout)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    assert "Traceback" not in res.stderr
    return res


def _data_without_states(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("hidden_states", "eagle_data.json"))
    return dst


@pytest.fixture(scope="module")
def gpu_draft(toy_target: Path, toy_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A drafter trained offline on the GPU by `eagle train` (defaults: shape buckets on)."""
    out = tmp_path_factory.mktemp("gpu-draft") / "draft"
    _eagle("train", "--model", str(toy_target), "--data", str(toy_data), "--out", str(out), "--epochs", "8",
           "--device", "cuda", "--json")
    return out


def test_capture_pipeline_with_and_without_a_device_index(toy_target: Path) -> None:
    import torch

    from eagle.data import load_model
    from eagle.hidden_capture import CapturePipeline, HiddenCapture

    model = load_model(toy_target, "cuda", "auto")
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(0, 2048, (n,), generator=g).tolist() for n in (37, 64, 5, 90)]
    results = {}
    for device in ("cuda", torch.device("cuda"), "cuda:0"):
        capture = HiddenCapture(model, [2, 4, 5])
        got: dict[int, torch.Tensor] = {}
        stats = CapturePipeline(capture, device, writers=2).run(
            rows, [[0, 1], [2, 3]], sink=lambda i, hs, got=got: got.__setitem__(i, hs.clone()) or 0)
        capture.close()
        assert stats.samples == 4 and sorted(got) == [0, 1, 2, 3]
        assert all(got[i].shape == (len(rows[i]), 4, 128) for i in got)
        assert all(bool(torch.isfinite(t.float()).all()) for t in got.values())
        results[str(device)] = got
    ref = results["cuda:0"]
    for got in results.values():
        assert all(torch.equal(got[i], ref[i]) for i in ref)


def test_gpu_extraction_files_equal_the_cpu_ones(toy_target: Path, toy_data: Path, tmp_path: Path) -> None:
    import torch

    from eagle import hidden_io
    from eagle.extract import extract

    cpu = _data_without_states(toy_data, tmp_path / "cpu")
    gpu = _data_without_states(toy_data, tmp_path / "gpu")
    extract(model=toy_target, data=cpu, device="cpu", echo=False)
    extract(model=toy_target, data=gpu, device="cuda", echo=False)  # bf16 on the GPU, fp32 on the CPU
    rows = hidden_io.list_samples(cpu)
    assert rows and rows == hidden_io.list_samples(gpu)
    worst = 0.0
    for r in rows:
        a, b = hidden_io.load_sample(cpu, r), hidden_io.load_sample(gpu, r)
        assert torch.equal(a["token_ids"], b["token_ids"])
        ha, hb = a["hidden_states"].float(), b["hidden_states"].float()
        assert ha.shape == hb.shape
        # per layer: the error relative to that layer's scale (bf16 keeps 8 bits of mantissa)
        err = ((ha - hb).norm(dim=(0, 2)) / ha.norm(dim=(0, 2))).max().item()
        worst = max(worst, err)
    print(f"worst per-layer relative error GPU (bf16) vs CPU (fp32): {worst:.2e}")
    assert worst < 2e-2


def test_train_on_gpu_compiles_once_per_shape(toy_target: Path, toy_data: Path, tmp_path: Path) -> None:
    """The real loop on variable-length packs: shape buckets and the shape warm-up on by default with
    CUDA, and from step 1 on dynamo compiles nothing new, validation included (the KV cache's stride
    guards used to recompile every new pack shape until the recompile limit; shapes first met in a
    later epoch compiled mid-training)."""
    import torch
    from torch._dynamo.utils import counters

    import eagle.train as train_mod

    seen: list[int] = []
    original = train_mod.optimizer_step

    def counted(*a, **k):  # noqa: ANN002, ANN003
        original(*a, **k)
        seen.append(counters["stats"]["unique_graphs"])

    train_mod.optimizer_step = counted
    try:
        log = train_mod.train(train_mod.TrainArgs(model=str(toy_target), data=str(toy_data), out=str(tmp_path / "d"),
                                                  epochs=3, device="cuda"), echo=False)
    finally:
        train_mod.optimizer_step = original
    assert log.args.shape_buckets is True and log.args.layout_multiple == 256 and log.args.warm_shapes is True
    per_epoch = [r.steps for r in log.epochs]
    print({"graphs_after_each_step": seen, "steps": per_epoch, "losses": [r.train_loss for r in log.epochs],
           "warmup": log.warmup})
    assert log.warmup is not None and log.warmup.train_shapes >= 1
    assert seen and len(set(seen)) == 1, seen
    assert log.epochs[-1].train_loss < log.epochs[0].train_loss
    assert torch.cuda.max_memory_allocated() > 0
    assert (tmp_path / "d" / "tensorboard").is_dir()


def test_train_online_on_gpu(toy_target: Path, toy_data: Path, tmp_path: Path) -> None:
    data = _data_without_states(toy_data, tmp_path / "data")
    res = _eagle("train", "--model", str(toy_target), "--data", str(data), "--out", str(tmp_path / "d"), "--online",
                 "--epochs", "2", "--device", "cuda", "--json")
    m = json.loads(res.stdout)
    assert m["est_accept_len"] > 1.0 and m["train_tok_s"] > 0
    log = json.loads((tmp_path / "d" / "train_log.json").read_text())
    assert log["args"]["online"] and log["epochs"][-1]["target_s"] > 0


def test_evaluate_and_bench_on_the_fast_decoder(toy_target: Path, gpu_draft: Path, tmp_path: Path) -> None:
    metrics = tmp_path / "eval.json"
    _eagle("evaluate", "--model", str(toy_target), "--draft", str(gpu_draft), "--prompts", str(HELDOUT),
           "--limit", "8", "--max-new-tokens", "48", "--device", "cuda", env={"RUNBOOK_METRICS": str(metrics)})
    ev = json.loads(metrics.read_text())
    assert ev["greedy_match"] == 1  # the speculative output equals transformers' greedy generate
    assert ev["accept_len"] > 1.8
    metrics = tmp_path / "bench.json"
    res = _eagle("bench", "--model", str(toy_target), "--draft", str(gpu_draft), "--prompts", str(HELDOUT),
                 "--limit", "8", "--max-new-tokens", "64", "--device", "cuda", "--json",
                 env={"RUNBOOK_METRICS": str(metrics)})
    report, bm = json.loads(res.stdout), json.loads(metrics.read_text())
    print({"evaluate": ev, "bench": bm})
    assert report["spec_matches_plain"] is True
    assert bm["speedup"] > 1.0 and bm["accept_len"] > 1.8


def test_ddp_two_processes(toy_target: Path, toy_data: Path, tmp_path: Path) -> None:
    import torch

    torchrun = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
    out = tmp_path / "ddp"
    res = subprocess.run([torchrun, "--nproc-per-node", "2", "--master-port", "29561", "-m", "eagle.cli", "train",
                          "--model", str(toy_target), "--data", str(toy_data), "--out", str(out), "--epochs", "2",
                          "--device", "cuda", "--no-tensorboard"],
                         capture_output=True, text=True, env=ENV, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    log = json.loads((out / "train_log.json").read_text())
    assert log["args"]["world_size"] == 2
    assert all(e["train_loss"] == e["train_loss"] for e in log["epochs"])  # finite, not NaN
    if torch.cuda.device_count() < 2:
        assert "share GPUs over gloo" in res.stderr


def test_doc_attention_runs_on_the_flash_kernel_and_equals_its_definition() -> None:
    """The training attention (eagle/doc_attention.py, the anchor form) on CUDA in bfloat16: SDPA
    restricted to the flash kernel accepts it (no mask, head size padded to a multiple of 8), and
    the output is within 1.5 bfloat16 ulps of the attention by definition for 0-2 earlier draft steps."""
    import torch
    from test_doc_attention import bf16_ulp, worst_error_against_the_definition
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        for blocks in (1, 2, 3):
            for amplitude in (1.0, 6.0):
                err, size = worst_error_against_the_definition("cuda", torch.bfloat16, amplitude, blocks)
                assert err <= 1.5 * bf16_ulp(size), (blocks, amplitude, err, size)

"""The GPU paths, on a real CUDA device (`make test-gpu`; skipped where torch sees no GPU).

One call on the lent GPU machine runs all of it: the capture engine with and without a device
index, its whole-decoder graph (and CUDA-graph replay) against the per-layer one, extraction files
against the CPU's (bf16 tolerance), `eagle train` offline and --online with shape buckets and no
recompiles after warm-up, the step as CUDA graphs (against the eager step, and `eagle train
--cuda-graphs`), evaluate and bench on the fast decoder (CUDA graphs),
the Triton decode attention and fused rope/norm/SwiGLU kernels (in CUDA graphs, and the fast
decoder with --attention triton), batches copied on a side stream while the step runs, DDP
across 2 processes (one per GPU, or sharing one GPU over gloo), sampled speculative decoding (seeded,
greedy untouched), a training run killed mid-epoch and resumed from its step state, and an MLA
drafter decoded and fine-tuned."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HELDOUT = Path(__file__).resolve().parents[2] / "plans" / "data" / "prompts-heldout.jsonl"
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

    from eagle.data.capture import CapturePipeline, HiddenCapture
    from eagle.target import load_model

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


def test_whole_decoder_capture_equals_the_layers_capture(toy_target: Path) -> None:
    """hidden_capture's scope "decoder" (one compiled graph, no mask built, the rope tables made
    outside it) and its CUDA-graph replay give the per-layer compiled capture's states (bf16: fusion
    changes roundings a little); a replay returns its own copy, which later replays do not
    overwrite, and the same graph run twice gives the same bits. (A first run is not compared bit
    for bit with later ones: torch.compile recompiles for dynamic shapes after the second width,
    and cuBLAS may choose other algorithms while a CUDA graph records.)"""
    import torch

    from eagle.data.capture import HiddenCapture, padded_input
    from eagle.target import load_model

    model = load_model(toy_target, "cuda", "auto")
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(0, 2048, (n,), generator=g).tolist() for n in (37, 64, 5, 90)]
    x, y = padded_input(rows, [0, 1], 64).cuda(), padded_input(rows, [2, 3], 64).cuda()
    layers = HiddenCapture(model, [2, 4, 5], compile=True)
    want = [layers.run(x), layers.run(y)]
    layers.uncompile()
    layers.close()
    for graphs in (False, True):
        torch._dynamo.reset()
        cap = HiddenCapture(model, [2, 4, 5])
        cap.compile_decoder(graphs=graphs)
        try:
            got = [cap.run(x), cap.run(y)]
            first = got[0].clone()
            later = [cap.run(x), cap.run(y), cap.run(x)]
        finally:
            cap.uncompile()
            cap.close()
        for a, b in zip(got + later[:2], want + want, strict=True):
            err = (a.float() - b.float()).norm() / b.float().norm()
            assert a.shape == b.shape and err < 1e-2, (graphs, float(err))
        assert torch.equal(got[0], first), graphs  # later replays did not write into an earlier result
        assert torch.equal(later[2], later[0]), graphs
    assert model.config._attn_implementation != "eagle_causal_sdpa"


def test_gpu_extraction_files_equal_the_cpu_ones(toy_target: Path, toy_data: Path, tmp_path: Path) -> None:
    import torch

    from eagle.data import hidden_io
    from eagle.data.extract import extract

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
    """The real loop on variable-length packs, the step without CUDA graphs (as under DDP or
    --grad-accum): shape buckets and the shape warm-up on by default with CUDA, and from step 1 on
    dynamo compiles nothing new, validation included (the KV cache's stride guards used to recompile
    every new pack shape until the recompile limit; shapes first met in a later epoch compiled
    mid-training)."""
    import torch
    from torch._dynamo.utils import counters

    from eagle.train.config import TrainConfig
    from eagle.train.hooks import StepHooks
    from eagle.train.trainer import train

    seen: list[int] = []

    class Counted(StepHooks):
        def after_optimizer(self) -> None:
            seen.append(counters["stats"]["unique_graphs"])

    log = train(TrainConfig(model=str(toy_target), data=str(toy_data), out=str(tmp_path / "d"), epochs=3,
                            device="cuda", cuda_graphs=False), echo=False, hooks=Counted())
    assert log.args.shape_buckets is True and log.args.layout_multiple == 256 and log.args.warm_shapes is True
    per_epoch = [r.steps for r in log.epochs]
    print({"graphs_after_each_step": seen, "steps": per_epoch, "losses": [r.train_loss for r in log.epochs],
           "warmup": log.warmup})
    assert log.warmup is not None and log.warmup.train_shapes >= 1
    assert seen and len(set(seen)) == 1, seen
    assert log.epochs[-1].train_loss < log.epochs[0].train_loss
    assert torch.cuda.max_memory_allocated() > 0
    assert (tmp_path / "d" / "tensorboard").is_dir()


def test_train_on_gpu_runs_the_step_as_cuda_graphs(toy_target: Path, toy_data: Path, tmp_path: Path) -> None:
    """`eagle train --cuda-graphs` on one GPU: every training pack shape captured as a CUDA graph in the
    warm-up (none failed), and the epochs' losses those of the same run without graphs; the saved
    epoch state resumes without graphs (its optimizer made not capturable again)."""
    from eagle.train.config import TrainConfig
    from eagle.train.trainer import train

    logs = {graphs: train(TrainConfig(model=str(toy_target), data=str(toy_data), out=str(tmp_path / f"graphs-{graphs}"),
                                      epochs=2, device="cuda", cuda_graphs=graphs), echo=False)
            for graphs in (True, False)}
    with_graphs, without = logs[True], logs[False]
    print({"with": [(r.train_loss, r.val_loss, r.step_ms) for r in with_graphs.epochs], "warmup": with_graphs.warmup,
           "without": [(r.train_loss, r.val_loss, r.step_ms) for r in without.epochs]})
    assert with_graphs.args.cuda_graphs is True and without.args.cuda_graphs is False
    assert with_graphs.warmup is not None and with_graphs.warmup.cuda_graphs == with_graphs.warmup.train_shapes >= 1
    assert with_graphs.epochs[-1].train_loss < with_graphs.epochs[0].train_loss
    assert [r.train_loss for r in with_graphs.epochs] == pytest.approx([r.train_loss for r in without.epochs], rel=2e-2)
    assert [r.val_loss for r in with_graphs.epochs] == pytest.approx([r.val_loss for r in without.epochs], rel=2e-2)
    resumed = train(TrainConfig(model=str(toy_target), data=str(toy_data), out=str(tmp_path / "graphs-True"), epochs=3,
                                device="cuda", cuda_graphs=False, resume=True), echo=False)
    assert [r.epoch for r in resumed.epochs] == [1, 2, 3] and resumed.epochs[-1].train_loss < resumed.epochs[0].train_loss


def test_train_step_as_cuda_graphs_equals_the_eager_step(toy_target: Path) -> None:
    """eagle/train/step_graph.py: the whole step (forward, backward, clip, AdamW) replayed as one CUDA graph
    per batch shape gives the eager step's losses and weights: two pack shapes interleaved, a
    learning rate that changes every step (warm-up), batches fed by the loader's threads while the
    graphs are captured. The optimizer state made for capture changes no weight, and replaying
    leaves the gradients None (they live inside the graphs)."""
    import copy

    import torch

    from bench.shapes import samples
    from eagle.drafter import model as drafter
    from eagle.train import dataset
    from eagle.train.steps import (
        compile_settings,
        graphed_train_step,
        lr_lambda,
        step_autocast,
        train_step,
        use_doc_attention,
    )

    compile_settings()
    drafter.use_sync_free_metrics()
    shape = {"hidden_size": 128, "vocab_size": 2048}
    budget, dv = 252, 256
    g = torch.Generator().manual_seed(3)
    raw = samples(shape, [int(n) for n in torch.randint(30, 80, (16,), generator=g)], aux=3, seed=4)
    shifted = [dataset.shift_sample(s, budget) for s in raw]
    packs = [[0, 1, 2], [3, 4], [5, 6, 7], [8, 9], [10, 11, 12], [13, 14]]  # two grids: 3 and 2 documents

    def host(idx: list[int]) -> dict:
        return dataset.collate([shifted[i] for i in idx], dtype=torch.bfloat16, layout=True, pin=True,
                               layout_multiple=128, pad_to=budget)

    d2t, t2d = torch.zeros(dv, dtype=torch.long), torch.zeros(2048, dtype=torch.bool)
    t2d[:dv] = True
    torch.manual_seed(0)
    eager = drafter.build_drafter(toy_target, layer_ids=[2, 4, 5], d2t=d2t, t2d=t2d, ttt_steps=3).cuda()
    graphs = copy.deepcopy(eager)
    start = {n: p.detach().clone() for n, p in eager.named_parameters() if p.requires_grad}
    runs = {}
    for name, model in (("eager", eager), ("graphs", graphs)):
        use_doc_attention(model)
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=3e-3, betas=(0.9, 0.95), weight_decay=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(len(packs), 3))
        losses = drafter.loss_config()
        autocast = step_autocast("cuda", cache=name == "eager")
        step = graphed_train_step(model, opt, params, 3, losses, autocast) if name == "graphs" else None
        got = []
        for batch in dataset.prefetched(lambda idx: dataset.to_device(host(idx), torch.device("cuda")), packs, 2):
            if step is None:
                loss, _ = train_step(model, batch, opt, sched, params, 3, losses, autocast)
            else:
                if not step.graphs:  # the first capture: the state it creates moves no weight
                    step.capture(batch)
                    assert all(torch.equal(p, start[n]) for n, p in model.named_parameters() if p.requires_grad)
                loss = step(batch)[0]
                sched.step()
                assert all(p.grad is None for p in params)
            got.append(float(loss))
        runs[name] = (got, step)
    (eager_losses, _), (graph_losses, step) = runs["eager"], runs["graphs"]
    print({"eager": eager_losses, "graphs": graph_losses, "captured": step.captured, "failure": step.failure})
    assert step.captured == 2 and step.failure is None
    # (the six packs hold different random states: their losses need not fall; the weights must move)
    assert graph_losses == pytest.approx(eager_losses, rel=2e-3)
    moved = drift = 0.0
    trained = dict(eager.named_parameters())
    for n, p in graphs.named_parameters():
        if p.requires_grad:
            moved += float((trained[n] - start[n]).float().norm() ** 2)
            drift += float((p - trained[n]).float().norm() ** 2)
    assert moved > 0 and (drift / moved) ** 0.5 < 0.05, (drift, moved)


def test_batches_arrive_on_a_copy_stream_while_the_step_runs() -> None:
    """dataset.to_device on a prefetch thread while the step's stream is busy (100 products of 8192^2,
    ~0.15 s): it returns with the batch on the device, whole, readable from another stream at once,
    and the step's stream still busy: the copy did not queue behind the step (as it did on that stream).

    Measured in the steady state `eagle train` runs in: one persistent prefetch thread (its copy stream
    is thread-local) that has moved a batch of this size before. A first batch is not: its device
    memory comes from cudaMalloc on the copy stream's own allocator pool, and its pinned staging from
    cudaHostAlloc, and both wait for the whole device, behind the step (the test failed 3 times out of 3
    when it ran first in its process, 2026-12-04)."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from eagle.train import dataset

    host = {"hidden_states": torch.randn(8192, 4096).to(torch.bfloat16).pin_memory(), "input_ids": torch.arange(8192)}
    side = torch.cuda.Stream()

    def read_back(batch: dict) -> dict:
        with torch.cuda.stream(side):
            back = {k: v.to("cpu", non_blocking=True) for k, v in batch.items()}
        side.synchronize()
        return back

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    with ThreadPoolExecutor(max_workers=1) as prefetch:
        warm = prefetch.submit(dataset.to_device, host, torch.device("cuda")).result()
        read_back(warm)
        a @ a
        del warm
        torch.cuda.synchronize()
        for _ in range(100):
            a @ a
        batch = prefetch.submit(dataset.to_device, host, torch.device("cuda")).result()
        back = read_back(batch)
        busy = not torch.cuda.default_stream().query()
    torch.cuda.synchronize()
    assert busy
    assert all(v.is_cuda for v in batch.values())
    assert torch.equal(back["hidden_states"], host["hidden_states"]) and torch.equal(back["input_ids"], host["input_ids"])


def test_train_online_on_gpu(toy_target: Path, toy_data: Path, tmp_path: Path) -> None:
    data = _data_without_states(toy_data, tmp_path / "data")
    res = _eagle("train", "--model", str(toy_target), "--data", str(data), "--out", str(tmp_path / "d"), "--online",
                 "--epochs", "2", "--device", "cuda", "--json")
    m = json.loads(res.stdout)
    assert m["val_accept_len"] > 1.0 and m["train_tok_s"] > 0
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


def test_triton_attention_kernel_in_a_cuda_graph() -> None:
    """The split-KV kernels compiled for the GPU: equal to a float64 softmax over the allowed slots
    (fp32 to 1e-5, bf16 to 2e-2), and one CUDA graph captured at one set of slots replays correctly at
    others (the length is read from the slots tensor on the device, never from the host)."""
    import torch
    from _triton_cases import reference  # float64 softmax over the allowed slots

    from eagle.decode.triton_attention import decode_attention

    gen = torch.Generator(device="cuda").manual_seed(0)
    hkv, g, d, s = 8, 4, 128, 1024
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        k = torch.randn(hkv, s, d, device="cuda", generator=gen).to(dtype)
        v = torch.randn(hkv, s, d, device="cuda", generator=gen).to(dtype)
        for t in (1, 4):
            q = torch.randn(hkv, g * t, d, device="cuda", generator=gen).to(dtype)
            slots = torch.zeros(t, dtype=torch.long, device="cuda")

            def run(q=q, k=k, v=v, slots=slots, g=g):
                return decode_attention(q, k, v, slots, g)

            for _ in range(2):
                run()  # compile, warm up
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = run()
            for last in (t - 1, 63, 64, 500, s - 1):
                slots.copy_(torch.arange(last - t + 1, last + 1))
                graph.replay()
                err = (out.double() - reference(q, k, v, slots, g)).abs().max().item()
                assert err <= tol, (dtype, t, last, err)


def test_fused_triton_ops_in_a_cuda_graph() -> None:
    """eagle/decode/triton_ops.py compiled for the GPU, in bf16 on the 8B shape's rows, captured in one CUDA
    graph and replayed at other slots: rope (read from the tables at each row's slot) + cache write
    equal to apply_rope + index_copy_ bit for bit (queries, keys and values), SwiGLU and RMSNorm within
    one bf16 rounding of torch's ops, RMSNorm's kept input equal to its input."""
    import torch
    import torch.nn.functional as F

    from eagle.decode import llama_ops, triton_ops

    gen = torch.Generator(device="cuda").manual_seed(0)
    bf16, t, hq, hkv, d, hidden, inter = torch.bfloat16, 4, 32, 8, 128, 4096, 14336
    rope = llama_ops.Rope(1.0 / (500000 ** (torch.arange(0, d, 2, device="cuda").float() / d)))
    qkv = torch.randn(t, hq + 2 * hkv, d, device="cuda", generator=gen).to(bf16)
    x = torch.randn(t, hidden, device="cuda", generator=gen).to(bf16)
    w = torch.rand(hidden, device="cuda", generator=gen).to(bf16)
    gate_up = (4 * torch.randn(t, 2 * inter, device="cuda", generator=gen)).to(bf16)
    slots = torch.arange(t, device="cuda")
    k_cache, v_cache = (torch.zeros(hkv, 1024, d, device="cuda", dtype=bf16) for _ in range(2))
    cos, sin = rope.table(1024, bf16)
    kept = torch.zeros(t, 3 * hidden, device="cuda", dtype=bf16)

    def run():
        q = triton_ops.rope_write(qkv[:, : hq + hkv], qkv[:, hq + hkv:], cos, sin, slots, k_cache, v_cache)
        return q, triton_ops.rms_norm(x, w, 1e-5, keep=kept[:, hidden:2 * hidden]), triton_ops.silu_mul(gate_up)

    for _ in range(2):
        run()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q, norm, swiglu = run()
    ulp = 2.0 ** -7  # one bf16 step, relative
    for first in (0, 517, 1020):
        slots.copy_(torch.arange(first, first + t))
        graph.replay()
        qk = llama_ops.apply_rope(qkv[:, : hq + hkv], *rope(slots, bf16))
        assert torch.equal(q, qk[:, :hq].transpose(0, 1))
        assert torch.equal(k_cache[:, slots], qk[:, hq:].transpose(0, 1))
        assert torch.equal(v_cache[:, slots], qkv[:, hq + hkv:].transpose(0, 1))
    ref = F.rms_norm(x.float(), (hidden,), w.float(), 1e-5)
    assert ((norm.float() - ref).abs() <= ulp * ref.abs() + 1e-6).all()
    assert torch.equal(kept[:, hidden:2 * hidden], x) and not kept[:, :hidden].any() and not kept[:, 2 * hidden:].any()
    gate, up = gate_up.chunk(2, dim=-1)
    ref = F.silu(gate.float()) * up.float()
    assert ((swiglu.float() - ref).abs() <= 2 * ulp * ref.abs() + 1e-6).all()
    same = (swiglu == F.silu(gate) * up).float().mean().item()
    print(f"SwiGLU bits equal to F.silu(gate) * up on {same:.4%} of elements")


def test_fast_decoder_with_triton_attention_equals_sdpa(toy_target: Path, gpu_draft: Path, tmp_path: Path) -> None:
    """The fast decoder under CUDA graphs with --attention triton: greedy and speculative output
    equal to SDPA's in float32 (the kernels agree to rounding; the trained toy's logits are not
    near ties), speculative == plain greedy in bfloat16; then `eagle bench --attention triton`."""
    import torch

    from eagle.decode.factory import load_decoder
    from eagle.decode.interface import required_len
    from eagle.prompts import load_prompt_token_ids

    prompts = load_prompt_token_ids(toy_target, HELDOUT, 8)
    max_len = required_len(max(map(len, prompts)), 48, 3)
    outs: dict[tuple[str, str], tuple[list, list]] = {}
    for dtype in (torch.float32, torch.bfloat16):
        for kernel in ("sdpa", "triton"):
            dec = load_decoder(toy_target, gpu_draft, max_len=max_len, device="cuda", dtype=dtype, attention=kernel)
            assert dec.use_graphs and dec.attention == kernel
            greedy = [dec.generate_greedy(p, 48) for p in prompts]
            spec = [dec.generate_speculative(p, 48, 3).tokens for p in prompts]
            outs[(str(dtype), kernel)] = (greedy, spec)
            assert spec == greedy, (dtype, kernel)
            del dec
    f32 = str(torch.float32)
    assert outs[(f32, "triton")] == outs[(f32, "sdpa")]
    bf16 = str(torch.bfloat16)
    same = sum(a == b for a, b in zip(outs[(bf16, "triton")][0], outs[(bf16, "sdpa")][0], strict=True))
    print(f"bf16: triton's greedy output equals sdpa's on {same}/{len(prompts)} prompts")
    res = _eagle("bench", "--model", str(toy_target), "--draft", str(gpu_draft), "--prompts", str(HELDOUT),
                 "--limit", "8", "--max-new-tokens", "64", "--device", "cuda", "--attention", "triton", "--json")
    report = json.loads(res.stdout)
    print({"bench --attention triton": report})
    assert report["attention"] == "triton" and report["spec_matches_plain"] is True


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
    """The training attention (eagle/train/doc_attention.py, the anchor form) on CUDA in bfloat16: SDPA
    restricted to the flash kernel accepts it (no mask, head size padded to a multiple of 8), and
    the output is within 1.5 bfloat16 ulps of the attention by definition for 0-2 earlier draft steps."""
    import torch
    from helpers import load_test_module

    cases = load_test_module("eagle/train/test_doc_attention.py")
    bf16_ulp, worst_error_against_the_definition = cases.bf16_ulp, cases.worst_error_against_the_definition
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        for blocks in (1, 2, 3):
            for amplitude in (1.0, 6.0):
                err, size = worst_error_against_the_definition("cuda", torch.bfloat16, amplitude, blocks, varlen=False)
                assert err <= 1.5 * bf16_ulp(size), (blocks, amplitude, err, size)


def test_doc_attention_varlen_form_equals_its_definition() -> None:
    """The varlen form (eagle/doc_attention.doc_varlen: the pack as it lies, torch's variable-length
    flash attention), which doc_sdpa picks on this GPU, in bfloat16: within 1.5 ulps of the attention
    by definition on every real token for 0-2 earlier draft blocks, with and without the pack's
    padding tokens (which join the last document)."""
    import torch
    from helpers import load_test_module

    cases = load_test_module("eagle/train/test_doc_attention.py")
    bf16_ulp, worst_error_against_the_definition = cases.bf16_ulp, cases.worst_error_against_the_definition

    from eagle.train import doc_attention

    assert doc_attention.varlen_available(torch.empty(1, 1, 1, 16, device="cuda", dtype=torch.bfloat16), 2)
    for total in (17, 24):
        for blocks in (1, 2, 3):
            for amplitude in (1.0, 6.0):
                err, size = worst_error_against_the_definition("cuda", torch.bfloat16, amplitude, blocks, total=total)
                assert err <= 1.5 * bf16_ulp(size), (total, blocks, amplitude, err, size)


# ---------------------------------------------------------------- sampled decoding, step resume, MLA drafters


def test_sampled_speculative_decoding_on_cuda_is_seeded_and_leaves_greedy_alone(toy_target: Path, gpu_draft: Path,
                                                                                tmp_path: Path) -> None:
    """The fast decoder on CUDA at the production sampler (eagle/decode/sampling.py; those cycles run
    eagerly): one seed gives the same sampled tokens twice, and temperature 0 changes no byte of the
    greedy metrics."""
    def run(name: str, *flags: str) -> tuple[bytes, dict]:
        metrics = tmp_path / f"{name}.json"
        res = _eagle("evaluate", "--model", str(toy_target), "--draft", str(gpu_draft), "--prompts", str(HELDOUT),
                     "--limit", "4", "--max-new-tokens", "32", "--device", "cuda", "--json", *flags,
                     env={"RUNBOOK_METRICS": str(metrics)})
        return metrics.read_bytes(), json.loads(res.stdout)

    plain_bytes, plain = run("plain")
    zero_bytes, _ = run("zero", "--temperature", "0", "--top-p", "0.5", "--seed", "9")
    assert zero_bytes == plain_bytes and plain["decoder"] == "fast"
    _, one = run("one", "--temperature", "1.0", "--top-p", "0.95", "--seed", "3")
    two_bytes, two = run("two", "--temperature", "1.0", "--top-p", "0.95", "--seed", "3")
    samples = [r["sampled_tokens"] for r in one["per_prompt"]]
    assert samples == [r["sampled_tokens"] for r in two["per_prompt"]] and all(samples)
    m = json.loads(two_bytes)
    print({"greedy accept_len": json.loads(plain_bytes)["accept_len"], "sampled": m["sampled_accept_len"]})
    assert 1.0 <= m["sampled_accept_len"] <= 4.0 and m["accept_len"] == json.loads(plain_bytes)["accept_len"]


def test_train_on_gpu_killed_mid_epoch_resumes_with_the_same_losses(tmp_path: Path) -> None:
    """`eagle train --device cuda --save-every-steps 3` SIGKILLed (the process this test started) once
    its first step state exists, then `--resume`d: every step's loss as in a run never stopped (to
    GPU rounding: the kernels are not bitwise deterministic run to run)."""
    import _train_data as td
    import torch

    from eagle.train.trainer import STEP_STATE

    target, data = td.make_small(tmp_path / "small")
    args = ["train", "--model", str(target), "--data", str(data), "--batch-tokens", "32", "--val-fraction", "0.2",
            "--lr", "3e-3", "--epochs", "2", "--device", "cuda", "--no-tensorboard", "--save-every-steps", "3"]

    def series(path: Path) -> dict[int, float]:
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        return {row["step"]: row["train_loss"] for row in rows if "train_loss" in row}

    _eagle(*args, "--out", str(tmp_path / "full"), env={"RUNBOOK_SERIES": str(tmp_path / "full.jsonl")})
    out, killed = tmp_path / "killed", tmp_path / "killed.jsonl"
    state = out / "checkpoints" / STEP_STATE
    td.kill_at_step_state([sys.executable, "-m", "eagle.cli", *args, "--out", str(out)], state,
                          {**ENV, "RUNBOOK_SERIES": str(killed)}, timeout=400)
    position = torch.load(state, weights_only=False)["position"]
    assert 0 < position["done"] < len(position["batches"])  # mid-epoch
    res = _eagle(*args, "--out", str(out), "--resume", env={"RUNBOOK_SERIES": str(killed)})
    assert "resuming from" in res.stdout + res.stderr
    want, got = series(tmp_path / "full.jsonl"), series(killed)
    assert sorted(got) == sorted(want)
    print({"steps": len(want), "largest gap": max(abs(got[s] - want[s]) for s in want)})
    assert all(got[s] == pytest.approx(want[s], rel=2e-3, abs=1e-4) for s in want)


def test_an_mla_drafter_decodes_and_fine_tunes_on_cuda(tmp_path: Path) -> None:
    """An MLA drafter in vLLM's layout (eagle/decode/mla_ops.py, eagle/drafter/mla.py) on a DeepSeek-V3
    target of the toy's shape: evaluate on CUDA gives greedy's output (greedy_match),
    and one more epoch of fine-tuning on CUDA lowers the training loss."""
    import _arch_helpers as arch_helpers
    from _mla_drafter import mla_drafter

    target = arch_helpers.random_target("deepseek_v3", tmp_path / "target")
    draft = mla_drafter(tmp_path / "mla")
    metrics = tmp_path / "eval.json"
    _eagle("evaluate", "--model", str(target), "--draft", str(draft), "--prompts", str(HELDOUT), "-k", "3",
           "--limit", "2", "--max-new-tokens", "16", "--device", "cuda", env={"RUNBOOK_METRICS": str(metrics)})
    ev = json.loads(metrics.read_text())
    assert ev["greedy_match"] == 1 and 1.0 <= ev["accept_len"] <= 4.0
    data = tmp_path / "data"
    prompts = Path(__file__).resolve().parents[2] / "plans" / "data" / "prompts.jsonl"
    _eagle("prepare", "--model", str(target), "--data", str(prompts), "--out", str(data), "--limit", "8",
           "--regenerate", "--max-new-tokens", "24", "--batch-size", "8")
    _eagle("extract", "--model", str(target), "--data", str(data), "--device", "cuda")
    _eagle("vocab", "--data", str(data), "--draft-vocab", "256")
    tuned = tmp_path / "tuned"
    _eagle("train", "--model", str(target), "--data", str(data), "--out", str(tuned), "--init-from", str(draft),
           "--epochs", "2", "--lr", "3e-3", "--device", "cuda", "--json")
    log = json.loads((tuned / "train_log.json").read_text())["epochs"]
    print({"mla train_loss": [e["train_loss"] for e in log], "accept_len": ev["accept_len"]})
    assert log[-1]["train_loss"] < log[0]["train_loss"]

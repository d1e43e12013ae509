"""Where the drafter's training step spends its time (issue 27: drafter step MFU >= 45% on fixed
shapes, the real loop within 10% of it), and what feeding it from the host costs.

    python -m bench.train_step_kernels --out $OUT        # on the H200: the 1.1B shape's drafter, ~2 min
    python -m bench.train_step_kernels --smoke            # tiny shapes on the CPU (a check of the code)

The step is `eagle.train.trainer.train_step` as `eagle train` runs it (speculators' compiled drafter forward,
per-document attention, bf16 autocast, AdamW, clip 1.0, its compile settings; `--settings torch,eagle`
also times torch's defaults) on fixed packs of 4 x 2047 tokens with
random bf16 hidden states (a step's time does not depend on their values) for the 1.1B Llama shape
of bench/gpu_throughput.py (hidden 2048, inter 5632, 32/4 heads, draft vocab 8000, ttt 3). One
drafter, compiled once, is timed three ways: batches already on the device (the step alone), and
batches built from pinned host memory on `eagle train`'s prefetch threads with the host-to-device
copy on the step's own stream (as `eagle train` did before dataset.to_device) or on a copy stream
(dataset.to_device); then `eagle train`'s real loop on `--rows` variable-length rows (1024-2048
tokens: packs padded to the same 8188-token budget, shape buckets, per-document widths rounded to
256, the copy stream; an untimed pass compiles the packs' shapes, `--passes` timed ones follow;
real tokens counted, padding not). Each feed's tok/s also as a fraction of the step alone, the main
thread's wait for its batches, and the pinned blocks torch's host allocator created during the feed
(cudaHostAlloc: page-locking 64-128 MB takes tens of ms). Per feed: steady tok/s and MFU (FLOPs of
bench/gpu_throughput.drafter_flops_per_token over the measured bf16 matmul rate); then a kernel
profile of 3 device-fed steps: device ms per step by category (matmul, attention, loss, optimizer,
Inductor's fused elementwise, other), kernels per step, the step's wall time under the profiler, and
the top kernels. Then, on the same drafter (left out with `--no-graphs`): the step with
speculators' accuracy counts made sync-free (drafter.use_sync_free_metrics), and the step as CUDA
graphs (eagle/train/step_graph.py, `eagle train --cuda-graphs`) on the device, fed on the copy stream and
in the real loop, with its profile. `--losses eager,fused` repeats it all with speculators' fused Triton KL loss (on
torch 2.11 dynamo fails to trace its autotuner: the run reports the error). Writes
OUT/train_step_kernels.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.harness import bench_device, kernel_profile, matmul_rate, sync, timed_feed, write_json
from bench.shapes import (
    SMOKE,
    TARGET_1B,
    bench_drafter,
    drafter_flops_per_token,
    random_target,
    row_lengths,
    samples,
    save_verifier,
)


def print_profile(label: str, title: str, prof: dict[str, Any], top: bool) -> None:
    """One kernel_profile as a line (and its top kernels)."""
    cats = ", ".join(f"{k} {v:.2f}" for k, v in prof["by_category_ms"].items())
    print(f"[{label}] {title}: {prof['kernels']} kernels, device {prof['device_ms']:.2f} ms of "
          f"{prof['wall_ms_profiled']:.2f} ms a step; {cats} ms", flush=True)
    for t in prof["top"] if top else []:
        print(f"    {t['ms']:8.3f} ms x{t['calls']:<4} {t['category']:<9} {t['kernel']}", flush=True)


def measure(impl: str, vdir: Path, raw: list[dict[str, torch.Tensor]], dv: int, vocab: int, layer_ids: list[int],
            dev: torch.device, steps: int, warmup: int, per_pack: int, ttt: int,
            variable: list[dict[str, torch.Tensor]] | None = None, passes: int = 4,
            settings: str = "eagle", graphs: bool = True) -> dict[str, Any]:
    """One drafter, compiled once; its step timed three ways: batches already on the device (the
    step alone), and fed from pinned host memory by eagle train's prefetch threads with the copy on
    the step's stream (as before dataset.to_device) or on a copy stream (dataset.to_device). With
    `variable` samples, a fourth: `eagle train`'s real loop on them (packs of the same budget padded
    to it, shape buckets, per-document widths rounded to 256, copy stream), one untimed pass over the
    packs compiling their shapes, then `passes` timed ones; its tok/s counts real tokens only."""
    from speculators.losses import resolve_loss_config

    from eagle.drafter import model as drafter
    from eagle.train import dataset
    from eagle.train.steps import compile_settings, graphed_train_step, lr_lambda, step_autocast, train_step

    if settings == "eagle":
        compile_settings()  # eagle train's (dynamo's recompile limit 64, two Inductor tiling options off)
    seq = raw[0]["input_ids"].shape[0]
    budget = per_pack * (seq - 1)
    shifted = [dataset.shift_sample(s, budget) for s in raw]
    order = [[(k * per_pack + j) % len(shifted) for j in range(per_pack)] for k in range(warmup + steps)]
    model, params, opt = bench_drafter(vdir, vocab, dv, layer_ids, ttt, dev)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(4 * len(order), max(1, len(order) // 5)))
    losses = resolve_loss_config("kl_div", impl)
    autocast = step_autocast(dev, cache=False)  # eagle train's with CUDA graphs (capture needs no cache)
    hdt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    cuda = dev.type == "cuda"

    def on_step_stream(idx: list[int]) -> dict[str, torch.Tensor]:  # HiddenStates.batch before to_device
        b = dataset.collate([shifted[i] for i in idx], dtype=hdt, layout=True, pin=cuda)
        return {k: v.to(dev, non_blocking=True) for k, v in b.items()}

    def on_copy_stream(idx: list[int]) -> dict[str, torch.Tensor]:  # HiddenStates.batch now
        return dataset.to_device(dataset.collate([shifted[i] for i in idx], dtype=hdt, layout=True, pin=cuda), dev)

    resident = [on_step_stream(idx) for idx in order]
    sync(dev)
    first: list[float] = []
    t_compile = time.perf_counter()
    for b in resident[:warmup]:
        loss, _ = train_step(model, b, opt, sched, params, ttt, losses, autocast)
        first.append(float(loss))
    out: dict[str, Any] = {"loss_impl": impl, "settings": settings,
                           "warmup_s": round(time.perf_counter() - t_compile, 1), "first_losses": first}
    feeds = {"device": lambda: iter(resident[warmup:]),
             "fed, copy on the step's stream": lambda: dataset.prefetched(on_step_stream, order[warmup:],
                                                                          dataset.loader_workers(dev)),
             "fed, copy stream (dataset.to_device)": lambda: dataset.prefetched(on_copy_stream, order[warmup:],
                                                                                dataset.loader_workers(dev))}
    def run(batches: Any, graphed: Any = None) -> dict[str, float]:
        """Train steps over `batches` (bench.timed_feed); with `graphed` (a GraphedStep) each step is
        its replay, the scheduler stepped after it. Returns the seconds, steps, the last step's
        loss, the main thread's ms a step waiting for its batch, and the pinned blocks torch's host
        allocator created meanwhile with their ms (a cold cache's cudaHostAllocs)."""
        def step(b: dict[str, torch.Tensor]) -> Any:
            if graphed is None:
                return train_step(model, b, opt, sched, params, ttt, losses, autocast)[0]
            loss = graphed(b)[0]
            sched.step()
            return loss

        r = timed_feed(batches, step, dev)
        return {"s": r["s"], "step_ms": r["step_ms"], "loss": float(r["last"]), "pin_allocs": r["pin_allocs"],
                "pin_alloc_ms": round(r["pin_alloc_ms"], 1), "pin_alloc_mb": round(r["pin_alloc_mb"], 1),
                "wait_ms": round(r["wait_ms"], 3)}

    def mode(r: dict[str, float], tokens: int) -> dict[str, Any]:
        """A timed run as a mode's row: tok/s of `tokens`, ms a step, and run's feed figures."""
        return {"tok_s": tokens / r["s"], "step_ms": r["step_ms"], "last_loss": r["loss"],
                "wait_ms": r["wait_ms"], "pin_allocs": r["pin_allocs"], "pin_alloc_ms": r["pin_alloc_ms"],
                "pin_alloc_mb": r["pin_alloc_mb"]}

    tokens = sum(int(b["loss_mask"].numel()) for b in resident[warmup:])
    out["modes"] = {}
    for name, feed in feeds.items():
        out["modes"][name] = mode(run(feed()), tokens)
    if graphs and cuda:
        # the same model and optimizer from here on: speculators' accuracy counts without their host
        # syncs (eager, as eagle train always counts them), then the whole step as CUDA graphs
        # (eagle train --cuda-graphs)
        drafter.use_sync_free_metrics()
        run(iter(resident[:2]))  # compiles the forward with the new counts
        out["modes"]["device, sync-free metrics"] = mode(run(iter(resident[warmup:])), tokens)
        graphed = graphed_train_step(model, opt, params, ttt, losses, autocast)
        t_capture = time.perf_counter()
        graphed.capture(resident[0])
        out["capture_s"] = round(time.perf_counter() - t_capture, 1)

        for name, feed in (("device, CUDA graphs", feeds["device"]),
                           ("fed, copy stream, CUDA graphs", feeds["fed, copy stream (dataset.to_device)"])):
            out["modes"][name] = mode(run(feed(), graphed), tokens)
        out["graph_failure"] = graphed.failure
    if variable:
        var_shifted = [dataset.shift_sample(s, budget) for s in variable]
        lengths = [int(s["input_ids"].shape[0]) for s in variable]
        packs = dataset.pack_batches(list(range(len(variable))), lengths, budget, seed=0)

        def bucketed(idx: list[int]) -> dict[str, torch.Tensor]:  # HiddenStates.batch as eagle train calls it
            return dataset.to_device(dataset.collate([var_shifted[i] for i in idx], dtype=hdt, layout=True, pin=cuda,
                                                     layout_multiple=256, pad_to=budget), dev)

        real = sum(min(n - 1, budget) for n in lengths) * passes
        eager_name = "real loop: variable rows, shape buckets, copy stream" + (", sync-free metrics" if graphs and cuda
                                                                              else "")
        for name, step in [(eager_name, None)] + ([("real loop, CUDA graphs", graphed)] if graphs and cuda else []):
            warm = run(dataset.prefetched(bucketed, packs, dataset.loader_workers(dev)), step)  # compiles, captures
            # the passes as one stream of batches, as an epoch's (a stream per pass would wait for
            # its first batch each time: a loader's latency every len(packs) steps)
            out["modes"][name] = {
                **mode(run(dataset.prefetched(bucketed, packs * passes, dataset.loader_workers(dev)), step), real),
                "packs": len(packs), "fill": sum(min(n - 1, budget) for n in lengths) / (len(packs) * budget),
                "warm_pass_s": round(warm["s"], 1)}
        if graphs and cuda:
            out["graphs_captured"] = graphed.captured
    out["tok_s"], out["step_ms"] = out["modes"]["device"]["tok_s"], out["modes"]["device"]["step_ms"]
    if cuda:
        out["profile"] = kernel_profile(lambda: train_step(model, resident[0], opt, None, params, ttt, losses, autocast),
                                        dev)
        if graphs:
            out["profile_graphs"] = kernel_profile(lambda: graphed(resident[0]), dev)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU: checks the code, measures nothing")
    p.add_argument("--out", default=os.environ.get("OUT"), help="write train_step_kernels.json here [$OUT]")
    p.add_argument("--losses", default="eager", help="speculators' loss implementations to compare (eager, fused)")
    p.add_argument("--steps", type=int, default=40, help="timed steps of each feed")
    p.add_argument("--warmup", type=int, default=4, help="steps before timing (the first compiles)")
    p.add_argument("--rows", type=int, default=32,
                   help="variable-length rows (1024-2048 tokens) of the real-loop feed; 0 leaves it out")
    p.add_argument("--passes", type=int, default=4, help="timed passes over the real loop's packs")
    p.add_argument("--no-graphs", action="store_true",
                   help="leave out the sync-free-metrics and CUDA-graph modes (every mode then counts accuracy as "
                        "speculators does, with its host syncs)")
    p.add_argument("--attention", choices=("auto", "grid", "varlen"), default="auto",
                   help="the drafter's per-document attention form (eagle/train/doc_attention.py): auto (eagle train's "
                        "choice: varlen on a GPU that runs it), grid, varlen")
    p.add_argument("--settings", default="eagle",
                   help="comma list of compile settings, each timed on a fresh compile: torch (torch's defaults), "
                        "eagle (eagle train's compile_settings; they stay set for the rest of the process, so "
                        "torch comes first)")
    a = p.parse_args(argv)
    chosen = [x for x in a.settings.split(",") if x]
    if not chosen or set(chosen) - {"torch", "eagle"} or chosen[-1:] == ["torch"] and "eagle" in chosen:
        p.error(f"--settings {a.settings!r}: torch and/or eagle, torch first")
    dev = bench_device(a.smoke)
    if dev is None:
        return 1
    from eagle.train import doc_attention

    doc_attention.use_varlen = {"auto": None, "grid": False, "varlen": True}[a.attention]
    shape = SMOKE if a.smoke else TARGET_1B
    seq, dv, ttt, per_pack = (64, 64, 3, 2) if a.smoke else (2048, 8000, 3, 4)
    steps, warmup = (2, 1) if a.smoke else (a.steps, a.warmup)
    n = shape["num_hidden_layers"]
    layer_ids = [2, n // 2, n - 3]
    impls = [i for i in a.losses.split(",") if i and not (a.smoke and i == "fused")]  # fused: Triton on CUDA
    scratch = Path(tempfile.mkdtemp(prefix="train_step_kernels-"))
    target = random_target(shape, dev, torch.float32 if a.smoke else torch.bfloat16)
    save_verifier(target, scratch / "verifier")
    del target
    matmul = matmul_rate(dev, 512 if a.smoke else 8192)
    flops = drafter_flops_per_token(shape["hidden_size"], shape["intermediate_size"], shape["num_attention_heads"],
                                    shape["num_key_value_heads"], dv, ttt, seq)
    raw = samples(shape, [seq] * (2 * per_pack), len(layer_ids))
    # the real loop's rows: 1024-2048 tokens (the smoke: 32-64)
    variable = samples(shape, row_lengths(a.rows, seq), len(layer_ids), seed=2) if a.rows else None
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M"), "torch": torch.__version__,
                              "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (smoke)",
                              "shape": shape, "pack": f"{per_pack} x {seq - 1}", "ttt": ttt, "draft_vocab": dv,
                              "attention": a.attention,
                              "matmul_tflops": round(matmul / 1e12, 1), "gflop_per_token": round(flops / 1e9, 3),
                              "runs": []}
    print(f"bf16 matmul {matmul / 1e12:.1f} TFLOP/s; drafter step {flops / 1e9:.3f} GFLOP/token; "
          f"packs {per_pack} x {seq - 1}; attention {a.attention}", flush=True)
    for impl, settings in [(i, x) for x in chosen for i in impls]:
        label = f"{impl}, {settings} settings"
        torch._dynamo.reset()
        try:
            r = measure(impl, scratch / "verifier", raw, dv, shape["vocab_size"], layer_ids, dev, steps, warmup,
                        per_pack, ttt, variable, 1 if a.smoke else a.passes, settings, not a.no_graphs)
        except Exception as e:  # noqa: BLE001 - keep measuring the other implementation
            r = {"loss_impl": impl, "settings": settings, "error": f"{type(e).__name__}: {e}"[:400]}
            print(f"[{label}] FAILED {r['error']}", flush=True)
        else:
            print(f"[{label}] warm-up {r['warmup_s']} s, first losses {', '.join(f'{v:.6f}' for v in r['first_losses'])}",
                  flush=True)
            for name, m in r["modes"].items():
                m["mfu"] = m["tok_s"] * flops / matmul
                m["of_step"] = m["tok_s"] / r["tok_s"]
                extra = (f"; {m['packs']} packs {m['fill']:.1%} full, warm pass {m['warm_pass_s']} s"
                         if "packs" in m else "")
                print(f"[{label}] {name}: {m['tok_s']:,.0f} tok/s, step {m['step_ms']:.2f} ms, MFU {m['mfu']:.1%}, "
                      f"{m['of_step']:.3f} of the step; waits {m['wait_ms']:.2f} ms a step, pinned blocks "
                      f"{m['pin_allocs']} ({m['pin_alloc_ms']:.0f} ms, {m['pin_alloc_mb']:.0f} MB){extra}", flush=True)
            if "capture_s" in r:
                print(f"[{label}] first capture {r['capture_s']} s; shapes captured {r.get('graphs_captured')}; "
                      f"failure {r.get('graph_failure')}", flush=True)
            if r.get("profile_graphs"):
                print_profile(label, "profile, CUDA graphs", r["profile_graphs"], top=False)
            if r.get("profile"):
                print_profile(label, "profile", r["profile"], top=True)
        result["runs"].append(r)
        write_json(a.out, "train_step_kernels.json", result)
    return 0 if all("error" not in r for r in result["runs"]) else 2


if __name__ == "__main__":
    sys.exit(main())

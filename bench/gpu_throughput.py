"""GPU throughput of hidden-state extraction and drafter training (issue 8): one call, one table.

    python -m bench.gpu_throughput            # on the H200: 1.1B Llama shape, random bf16 weights
    python -m bench.gpu_throughput --smoke    # tiny shapes on the CPU (a check of the code, not a number)

Measures, in this order, and prints one table at the end (also $OUT/gpu_throughput.{json,md}):
1. ceilings: bf16 matmul TFLOP/s (8192^3, random data), device-to-device copy (bytes read + written),
   disk write with fsync (64 MiB writes, one fsync per 256 MiB file).
2. extraction on the target (2k-token sequences, 16k tokens per batch): a naive transformers forward
   with output_hidden_states (logits and all layers); eagle/data/capture.py eager and compiled,
   compute only; compiled plus device-to-host copies; compiled plus files written with fsync
   (<= --write-gib), against the disk bound (disk bytes/s / bytes per token).
3. drafter training (speculators' Eagle3DraftModel, 1 layer, draft vocab 8000, ttt 3, sdpa, eager
   kl_div loss, bf16 autocast) on the same packed batches (hidden states captured from the target,
   4 x 2047 tokens a step, the same shape every step): speculators' own Trainer (its defaults:
   log_freq 1, linear warm-up), then eagle.train.trainer's step as written with speculators' packed-mask sdpa
   and with eagle/train/doc_attention.py's per-document attention (what `eagle train` uses), batches
   prefetched on a side thread. Tokens/s after warm-up, model FLOP utilisation against the measured
   matmul rate, per-step accuracies (rate of "steps 0..k all right", as conditional per-step
   accuracy) averaged over the last 10 steps. Fixed shapes: the real loop on variable-length packs
   is slower (bench/train_step_profile.py, docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from bench.harness import bench_device, sync, timed, write_json
from bench.shapes import (
    SMOKE,
    TARGET_1B,
    drafter_flops_per_token,
    random_target,
    save_verifier,
    target_flops_per_token,
)

ROWS: list[dict[str, Any]] = []  # name, value, unit, limit (name, ratio), peer (name, ratio), note
META: dict[str, Any] = {}
OUT_DIR: list[Path] = []  # where save() writes, when --out / $OUT is set


def save() -> None:
    """(Re)write OUT/gpu_throughput.{json,md}: after every row, so a run cut short keeps what it measured."""
    if OUT_DIR:
        write_json(OUT_DIR[0], "gpu_throughput.json", {"meta": META, "rows": ROWS})
        (OUT_DIR[0] / "gpu_throughput.md").write_text(markdown(META))


def row(name: str, value: float, unit: str, limit: tuple[str, float] | None = None,
        peer: tuple[str, float] | None = None, note: str = "") -> None:
    r = {"name": name, "value": value, "unit": unit, "note": note}
    if limit:
        r["limit"], r["of_limit"] = limit[0], value / limit[1] if limit[1] else None
    if peer:
        r["peer"], r["of_peer"] = peer[0], value / peer[1] if peer[1] else None
    ROWS.append(r)
    save()
    print(f"  {name}: {value:,.1f} {unit}" + (f"  ({r['of_limit']:.0%} of {limit[0]})" if limit else "")
          + (f"  ({r['of_peer']:.2f}x {peer[0]})" if peer else "") + (f"  [{note}]" if note else ""), flush=True)


def failed(name: str, exc: BaseException) -> None:
    msg = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    ROWS.append({"name": name, "value": None, "unit": "", "note": "FAILED " + msg})
    save()
    print(f"  {name}: FAILED {msg}", flush=True)
    traceback.print_exc(limit=6)


# ---------------------------------------------------------------- 1. ceilings
def ceilings(dev: torch.device, smoke: bool, scratch: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    n = 512 if smoke else 8192
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    s = timed(lambda: a @ b, dev, 3 if smoke else 10, 3)
    out["matmul"] = 2 * n**3 / s
    row("bf16 matmul (8192^3, random)", out["matmul"] / 1e12, "TFLOP/s")
    nbytes = (64 << 20) if smoke else (2 << 30)
    src = torch.randn(nbytes // 2, device=dev, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    s = timed(lambda: dst.copy_(src), dev, 3 if smoke else 10)
    out["copy"] = 2 * nbytes / s
    row("device copy (read + write)", out["copy"] / 1e9, "GB/s")
    chunk = torch.randint(0, 255, ((64 << 20),), dtype=torch.uint8).numpy().tobytes()
    files, per_file = (2, 1) if smoke else (12, 4)  # 12 x 256 MiB = 3 GiB
    scratch.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    for f in range(files):
        with open(scratch / f"disk-{f}", "wb") as fh:
            for _ in range(per_file):
                fh.write(chunk)
            fh.flush()
            os.fsync(fh.fileno())
    out["disk"] = files * per_file * len(chunk) / (time.perf_counter() - t0)
    for f in range(files):
        (scratch / f"disk-{f}").unlink()
    row("disk write + fsync (256 MiB files)", out["disk"] / 1e9, "GB/s")
    return out


# ---------------------------------------------------------------- 2. extraction


def extraction(shape: dict[str, int], dev: torch.device, dtype: torch.dtype, ceil: dict[str, float], smoke: bool,
               scratch: Path, write_gib: float, layer_ids: list[int], writers: int = 4) -> tuple[Any, Any]:
    from eagle.data import capture as hc

    seq, bsz = (64, 4) if smoke else (2048, 8)
    model = random_target(shape, dev, dtype)
    g = torch.Generator().manual_seed(1)
    n_rows = 32 if smoke else 96  # 96 x 2048 = 196k tokens for the in-memory runs
    rows = torch.randint(0, shape["vocab_size"], (n_rows, seq), generator=g).tolist()
    flops = target_flops_per_token(shape, seq)
    roof = ceil["matmul"] / flops
    row("target roofline (decoder FLOPs / matmul rate)", roof, "tok/s", note=f"{flops / 1e9:.2f} GFLOP/token")

    ids = torch.tensor(rows[:bsz], device=dev)

    def naive() -> None:
        with torch.no_grad():
            out = model(input_ids=ids, output_hidden_states=True)
            del out

    iters = 3 if smoke else 10
    naive_tok_s = bsz * seq / timed(naive, dev, iters)
    row("naive forward (output_hidden_states, logits)", naive_tok_s, "tok/s", limit=("roofline", roof))

    batches = hc.plan_buckets([seq] * n_rows, range(n_rows), bsz * seq, 64)
    results: dict[str, float] = {}
    for label, comp in (("eager", False), ("compiled", True)):
        name = f"capture {label}, compute only"
        cap = None
        try:
            cap = hc.HiddenCapture(model, layer_ids, compile=comp and not smoke)
            pipe = hc.CapturePipeline(cap, dev, pad_multiple=64)
            t0 = time.perf_counter()
            pipe.run(rows, batches[:2])  # warm-up (and the compile)
            warm = time.perf_counter() - t0
            st = pipe.run(rows, batches)
            row(name, st.tok_s, "tok/s", limit=("roofline", roof), peer=("naive", naive_tok_s),
                note=f"warm-up {warm:.0f} s" if comp else "")
            results[label] = st.tok_s
            if comp and dev.type == "cuda":  # where the compiled capture's time goes (issue 27: the gap to the roofline)
                kernel_profile(lambda pipe=pipe: pipe.run(rows, batches[:1]), dev, top=12)
        except Exception as e:  # noqa: BLE001 - keep measuring the rest
            failed(name, e)
            if cap is not None:
                cap.uncompile()
        finally:
            if cap is not None:
                cap.close()
    if not results:
        return model, rows
    best = max(results, key=results.get)
    per_token = (len(layer_ids) + 1) * shape["hidden_size"] * 2 + 8
    for n_writers in (writers, 2 * writers):
        cap = hc.HiddenCapture(model, layer_ids)  # compiled layers stay compiled
        pipe = hc.CapturePipeline(cap, dev, pad_multiple=64, depth=n_writers + 2, writers=n_writers)
        if n_writers == writers:
            try:
                pipe.run(rows, batches[:writers + 2], sink=lambda i, hs: 0)  # warm-up: the pinned buffers
                st = pipe.run(rows, batches, sink=lambda i, hs: 0)
                row(f"capture {best} + copy to pinned host", st.tok_s, "tok/s", limit=("roofline", roof),
                    peer=("naive", naive_tok_s), note=f"main thread waited {st.main_wait_s:.2f} s")
            except Exception as e:  # noqa: BLE001
                failed(f"capture {best} + copy to pinned host", e)
        try:
            sample_disk = file_ceiling(scratch / "ceil", seq, len(layer_ids) + 1, shape["hidden_size"], n_writers,
                                       min(write_gib, 3.0), smoke)
            disk_bound = sample_disk / per_token
            row(f"disk write + fsync, {per_token * seq / 1e6:.1f} MB sample files, {n_writers} threads",
                sample_disk / 1e9, "GB/s", limit=("disk (256 MiB files)", ceil["disk"] / 1e9),
                note=f"bound {disk_bound:,.0f} tok/s")
            n_write = max(2 * bsz, min(int(write_gib * (1 << 30) / (per_token * seq)), 64 if smoke else 10_000))
            wrows = torch.randint(0, shape["vocab_size"], (n_write, seq), generator=g).tolist()
            out = scratch / "hs"
            sink = hc.sample_writer(out, wrows, fsync=True)
            wb = hc.plan_buckets([seq] * n_write, range(n_write), bsz * seq, 64)
            pipe.run(wrows, wb[:1], sink=sink)  # warm-up: pinned buffers, first files
            st = pipe.run(wrows, wb[1:], sink=sink)
            row(f"capture {best} + files (fsync, {n_writers} writer threads, {st.bytes_written / 2**30:.1f} GiB)",
                st.tok_s, "tok/s", limit=("same-size-file disk bound", disk_bound), peer=("naive", naive_tok_s),
                note=f"{st.bytes_written / st.seconds / 1e9:.2f} GB/s; {st.tok_s * per_token / ceil['disk']:.0%} of the "
                     f"256 MiB-file bound; main thread waited {st.main_wait_s:.1f} s of {st.seconds:.1f} s")
            shutil.rmtree(out, ignore_errors=True)
        except Exception as e:  # noqa: BLE001
            failed(f"capture + files, {n_writers} writers", e)
        cap.close()
    return model, rows


def file_ceiling(d: Path, seq: int, layers: int, hidden: int, threads: int, gib: float, smoke: bool) -> float:
    """Bytes/s of `threads` threads writing sample-sized files exactly as the extraction does
    (hidden_capture.write_safetensors: temp file, write, fsync, rename), from memory, no GPU."""
    from concurrent.futures import ThreadPoolExecutor

    from eagle.data import capture as hc

    d.mkdir(parents=True, exist_ok=True)
    hs = torch.randn(seq, layers, hidden).to(torch.bfloat16)
    tid = torch.zeros(seq, dtype=torch.int64)
    per = hs.numel() * 2 + seq * 8
    n = max(2 * threads, int(gib * (1 << 30) / per)) if not smoke else 2 * threads
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        total = sum(pool.map(lambda i: hc.write_safetensors(d / f"hs_{i}.safetensors",
                                                             {"hidden_states": hs, "token_ids": tid}) or per, range(n)))
    rate = total / (time.perf_counter() - t0)
    shutil.rmtree(d, ignore_errors=True)
    return rate


# ---------------------------------------------------------------- 3. training


def kernel_profile(step: Any, dev: torch.device, top: int = 8) -> None:
    """Top CUDA kernels (share of device time) over 3 steps, as rows: the 'why' of the training figure."""
    try:
        _kernel_profile(step, dev, top)
    except Exception as e:  # noqa: BLE001 - a profile is a bonus, never a reason to lose the row
        failed("kernel profile", e)


def _kernel_profile(step: Any, dev: torch.device, top: int) -> None:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        sync(dev)
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    attr = "self_device_time_total" if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"
    total = sum(getattr(e, attr) for e in events) or 1
    for e in sorted(events, key=lambda e: -getattr(e, attr))[:top]:
        row(f"  kernel {e.key[:70]}", getattr(e, attr) / 3 / 1000, "ms/step",
            note=f"{getattr(e, attr) / total:.0%} of device time, {e.count // 3} calls/step")


def conditional(rates: list[float]) -> list[float]:
    from eagle.train.steps import step_accuracies

    return step_accuracies(rates, [1.0] * len(rates))


def training(model: Any, rows: list[list[int]], shape: dict[str, int], dev: torch.device, ceil: dict[str, float],
             smoke: bool, scratch: Path, layer_ids: list[int], steps: int, warmup: int) -> None:
    from eagle.data import capture as hc
    from eagle.drafter import model as drafter
    from eagle.train import dataset
    from eagle.train.steps import lr_lambda, step_autocast

    ttt, dv_want = 3, (64 if smoke else 8000)
    seq = len(rows[0])
    per_step = 4
    n_samples = min(len(rows), 16 if smoke else 48)
    cap = hc.HiddenCapture(model, layer_ids)
    samples = []
    counts = torch.zeros(shape["vocab_size"], dtype=torch.long)
    with torch.no_grad():
        for s in range(0, n_samples, 8):
            x = torch.tensor(rows[s: s + 8], device=dev)
            hs = cap.run(x)
            pred = model.lm_head(model.model.norm(hs[:, :, -1])).argmax(-1)
            counts += torch.bincount(pred.flatten().cpu(), minlength=shape["vocab_size"])
            for r in range(x.shape[0]):
                samples.append({"hidden_states": hs[r].to("cpu", torch.bfloat16), "input_ids": x[r].cpu(),
                                "loss_mask": torch.ones(seq, dtype=torch.long)})
    cap.close()
    dv = min(dv_want, shape["vocab_size"])
    top = torch.sort(torch.argsort(counts, descending=True, stable=True)[:dv]).values
    d2t = top - torch.arange(dv)
    t2d = torch.zeros(shape["vocab_size"], dtype=torch.bool)
    t2d[top] = True
    vdir = scratch / "verifier"
    save_verifier(model, vdir)
    del model
    torch.cuda.empty_cache() if dev.type == "cuda" else None
    budget = per_step * (seq - 1)
    shifted = [dataset.shift_sample(s, budget) for s in samples]
    order = [[(k * per_step + j) % len(shifted) for j in range(per_step)] for k in range(warmup + steps)]
    tokens = per_step * (seq - 1)
    h, inter = shape["hidden_size"], shape["intermediate_size"]
    flops = drafter_flops_per_token(h, inter, shape["num_attention_heads"], shape["num_key_value_heads"], dv, ttt, seq)
    row("drafter training FLOPs", flops / 1e9, "GFLOP/token", note="6 x matmul params x ttt + attention + verifier head")
    losses = drafter.loss_config()
    lr = 3e-3  # eagle train's default, for both loops
    results: dict[str, float] = {}

    def build() -> Any:
        torch.manual_seed(0)
        return drafter.build_drafter(vdir, layer_ids=layer_ids, d2t=d2t, t2d=t2d, ttt_steps=ttt).to(dev)

    def report(name: str, tok_s: float, accs: list[list[float]], peer: str | None) -> None:
        last = accs[-10:]
        mean = [sum(a[k] for a in last) / len(last) for k in range(ttt)]
        acc = conditional(mean)
        mfu = tok_s * flops / ceil["matmul"]
        row(name, tok_s, "tok/s", limit=("matmul rate (MFU)", ceil["matmul"] / flops),
            peer=(peer, results[peer]) if peer and peer in results else None,
            note=f"MFU {mfu:.1%}; step acc " + "/".join(f"{a:.3f}" for a in acc))

    autocast = step_autocast(dev)

    # (a) speculators' own Trainer, as its CLI builds it (log_freq 1, AdamW wd 0.01, linear warm-up)
    name = "speculators Trainer"
    try:
        from speculators.train.trainer import Trainer, TrainerConfig

        model_s = build()
        batches = []
        for idx in order:
            b = dataset.collate([shifted[i] for i in idx], dtype=torch.bfloat16)
            b["error_records"] = 0
            batches.append(b)
        loader = torch.utils.data.DataLoader(batches, batch_size=None, shuffle=False,
                                             pin_memory=dev.type == "cuda")
        seen: list[dict[str, Any]] = []
        phases: list[dict[str, Any]] = []

        class Grab(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                if isinstance(record.msg, dict) and "train" in record.msg:
                    seen.append(record.msg["train"])
                    if record.msg.get("profile"):
                        phases.append(record.msg["profile"])

        mlog = logging.getLogger("speculators.metrics")
        mlog.addHandler(Grab())
        mlog.setLevel(logging.INFO)
        cfg = TrainerConfig(lr=lr, num_epochs=1, save_path=str(scratch / "spec-ckpt"),
                            train_call_kwargs={"ttt_steps": ttt, "ttt_step_loss_decay": 1.0, "loss_config": losses},
                            val_call_kwargs={"ttt_steps": ttt, "ttt_step_loss_decay": 1.0, "loss_config": losses},
                            hidden_states_dtype=torch.bfloat16)
        trainer = Trainer(model_s, cfg, loader, None)
        marks: dict[str, float] = {}

        def cb() -> None:
            if trainer.global_step == warmup:
                sync(dev)
                marks["t0"] = time.perf_counter()

        trainer.train_epoch(0, step_callback=cb)
        sync(dev)
        results[name] = steps * tokens / (time.perf_counter() - marks["t0"])
        accs = [[m.get(f"full_acc_{k}", 0.0) for k in range(ttt)] for m in seen]
        report(name, results[name], accs, None)
        if phases:
            last = phases[warmup:] or phases
            med = {k: sorted(p[k] for p in last)[len(last) // 2] for k in ("fetch_ms", "fwd_ms", "bwd_ms", "opt_ms", "step_ms")}
            row("speculators Trainer step (its own synchronised timer)", med["step_ms"], "ms",
                note=" ".join(f"{k[:-3]} {v:.1f}" for k, v in med.items() if k != "step_ms"))
    except Exception as e:  # noqa: BLE001
        failed(name, e)

    # (b) eagle.train.trainer's own step (train.train_step, bf16 pinned batches, loss read once at the end): with
    # speculators' packed [T, (k+1)T] sdpa mask (the step before per-document attention) and as `eagle train`
    # runs it now (eagle/train/doc_attention.py: attention per document; the next batch collated and pinned on a
    # side thread, dataset.prefetched)
    from eagle.train.steps import train_step, use_doc_attention

    def eagle_loop(per_doc: bool, prof: bool = False) -> tuple[float, list[list[float]]]:
        model_e = build()
        if per_doc:
            use_doc_attention(model_e)
        params = [p for p in model_e.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(len(order), int(len(order) * 0.05)))
        model_e.train()
        hdt = torch.bfloat16 if dev.type == "cuda" else torch.float32

        def batch_of(idx: list[int]) -> dict[str, torch.Tensor]:
            b = dataset.collate([shifted[i] for i in idx], dtype=hdt, layout=per_doc)
            return {k: (v.pin_memory() if dev.type == "cuda" else v).to(dev, non_blocking=True) for k, v in b.items()}

        accs_dev: list[torch.Tensor] = []
        loss_sum = torch.zeros((), device=dev)
        t0 = 0.0
        for step, batch in enumerate(dataset.prefetched(batch_of, order)):
            if step == warmup:
                sync(dev)
                t0 = time.perf_counter()
            loss, metrics = train_step(model_e, batch, opt, sched, params, ttt, losses, autocast)
            loss_sum += loss
            accs_dev.append(torch.stack([metrics[f"full_acc_{k}_sum"] / metrics[f"full_acc_{k}_total"].clamp(min=1)
                                         for k in range(ttt)]).detach())
        sync(dev)
        tok_s = sum(sum(shifted[i]["input_ids"].shape[0] for i in idx) for idx in order[warmup:]) / (time.perf_counter() - t0)
        if prof and dev.type == "cuda":
            kernel_profile(lambda: train_step(model_e, batch_of(order[0]), opt, None, params, ttt, losses, autocast), dev)
        return tok_s, [a.float().tolist() for a in accs_dev]

    for label, per_doc in (("eagle train step, packed-mask sdpa (before)", False),
                           ("eagle train step, per-document attention (now)", True)):
        try:
            tok_s, accs = eagle_loop(per_doc, prof=True)
            results[label] = tok_s
            report(label, tok_s, accs, "speculators Trainer")
        except Exception as e:  # noqa: BLE001
            failed(label, e)


# ---------------------------------------------------------------- output
def markdown(meta: dict[str, Any]) -> str:
    if not meta:
        return ""
    lines = [f"{meta['date']}, {meta['gpu']}, torch {meta['torch']}, transformers {meta['transformers']}, "
             f"speculators {meta.get('speculators', '-')}", "",
             "| measurement | value | unit | vs limit | vs peer | note |", "| --- | ---: | --- | --- | --- | --- |"]
    for r in ROWS:
        v = "-" if r["value"] is None else f"{r['value']:,.1f}"
        lim = f"{r['of_limit']:.0%} of {r['limit']}" if r.get("of_limit") is not None else ""
        peer = f"{r['of_peer']:.2f}x {r['peer']}" if r.get("of_peer") is not None else ""
        lines.append(f"| {r['name']} | {v} | {r['unit']} | {lim} | {peer} | {r['note']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU: checks the code, measures nothing")
    p.add_argument("--out", default=os.environ.get("OUT"), help="write gpu_throughput.json/.md here [$OUT]")
    p.add_argument("--scratch", default=None, help="where files are written (default: a temp dir on local disk)")
    p.add_argument("--write-gib", type=float, default=6.0, help="hidden-state files written in the files run (<= 16)")
    p.add_argument("--steps", type=int, default=30, help="measured training steps (after --warmup)")
    p.add_argument("--warmup", type=int, default=4, help="training steps before timing (the first compiles)")
    p.add_argument("--skip", default="", help="comma list of parts to skip: ceilings,extract,train")
    a = p.parse_args(argv)
    if a.write_gib > 16:
        p.error("--write-gib: at most 16 (the machine's disk is 64 GiB)")
    dev = bench_device(a.smoke)
    if dev is None:
        return 1
    shape = SMOKE if a.smoke else TARGET_1B
    dtype = torch.float32 if a.smoke else torch.bfloat16
    n = shape["num_hidden_layers"]
    layer_ids = [2, n // 2, n - 3]
    scratch = Path(a.scratch or tempfile.mkdtemp(prefix="gpu_throughput-"))
    skip = set(a.skip.split(","))
    import transformers

    if a.out:
        OUT_DIR.append(Path(a.out))
    meta = META
    meta.update({"date": time.strftime("%Y-%m-%d"),
                            "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (smoke)",
                            "torch": torch.__version__, "transformers": transformers.__version__,
                            "shape": shape, "layer_ids": layer_ids})
    try:
        import importlib.metadata as md

        meta["speculators"] = md.version("speculators")
    except Exception:  # noqa: BLE001
        pass
    print(f"# gpu_throughput {meta}", flush=True)
    t_all = time.perf_counter()
    ceil = {"matmul": 1.0, "copy": 1.0, "disk": 1.0}
    if "ceilings" not in skip:
        try:
            ceil = ceilings(dev, a.smoke, scratch)
        except Exception as e:  # noqa: BLE001
            failed("ceilings", e)
    model, rows = None, None
    if "extract" not in skip or "train" not in skip:
        try:
            model, rows = extraction(shape, dev, dtype, ceil, a.smoke, scratch, a.write_gib, layer_ids)
        except Exception as e:  # noqa: BLE001
            failed("extraction", e)
    if "train" not in skip and model is not None:
        try:
            steps, warmup = (3, 1) if a.smoke else (a.steps, a.warmup)
            training(model, rows, shape, dev, ceil, a.smoke, scratch, layer_ids, steps, warmup)
        except Exception as e:  # noqa: BLE001
            failed("training", e)
    meta["seconds"] = round(time.perf_counter() - t_all, 1)
    meta["ceilings"] = ceil
    save()
    print("\n" + markdown(meta))
    shutil.rmtree(scratch, ignore_errors=True)
    return 0 if all(r["value"] is not None for r in ROWS) else 2


if __name__ == "__main__":
    sys.exit(main())

"""Multi-GPU scaling of `eagle extract` and `eagle train` (issue 11): 1 vs N processes, one call, one table.

    NCCL_NVLS_ENABLE=0 python bench/multi_gpu_scaling.py    # on nvidia-h200-x2: 1.1B Llama shape, random bf16
    python bench/multi_gpu_scaling.py --smoke               # tiny shapes, CPU processes with gloo (a check of
                                                            # the code: 2 processes on shared cores, not scaling)

Runs the real CLIs in subprocesses, in this order, on one random-token dataset:
1. `eagle extract` on 1 GPU (CUDA_VISIBLE_DEVICES=0), then under `torchrun --nproc-per-node N` (index % N
   sharding, rank R on cuda:R, no process group until the final summary). Two figures, both the tool's
   own (slowest rank for N): extract_tok_s = new tokens / seconds from before the model load to the last
   file written (load included: it dominates short runs), and extract_capture_tok_s = new tokens / seconds
   of the capture loop alone (first batch to last file written; the lazy torch.compile of the first
   batches stays in it). Scaling efficiency is computed on the capture figure (and, labelled, on the other).
2. `eagle vocab` on the 1-GPU extraction, then `eagle train` on it with 1 GPU and under torchrun with N
   (DDP, NCCL on GPU, gloo on CPU), the same epochs over the same samples. tok/s: the last epoch's
   train_tok_s from OUT/train_log.json (all ranks' tokens / epoch seconds; epoch 1 carries warm-up).
   A row per run sets the whole CLI run's wall seconds against the last epoch's seconds (the rest is
   start-up, loading, compilation, validation and saving).
   Validation: the best epoch's val_loss and per-step val_acc of each run (DDP doubles the global batch
   at the same learning rate, so "same accuracy within noise" is a finding, not a given).
Scaling efficiency = tok/s(N) / (N x tok/s(1)). NCCL_NVLS_ENABLE=0 is always set for the children.
Prints one table; writes OUT/multi_gpu_scaling.json after every row (OUT: --out, else $OUT).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TARGET_1B = {"hidden_size": 2048, "num_hidden_layers": 22, "intermediate_size": 5632, "vocab_size": 32000,
             "num_attention_heads": 32, "num_key_value_heads": 4}
SMOKE = {"hidden_size": 32, "num_hidden_layers": 8, "intermediate_size": 64, "vocab_size": 128,
         "num_attention_heads": 4, "num_key_value_heads": 2}

ROWS: list[dict[str, Any]] = []
META: dict[str, Any] = {}


def save(out: Path | None) -> None:
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "multi_gpu_scaling.json").write_text(json.dumps({"meta": META, "rows": ROWS}, indent=1) + "\n")


def row(out: Path | None, name: str, value: float | str, unit: str = "", note: str = "") -> None:
    ROWS.append({"name": name, "value": value, "unit": unit, "note": note})
    print(f"  {name}: {value} {unit} {note}".rstrip(), file=sys.stderr, flush=True)
    save(out)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------- inputs


def make_target(shape: dict[str, int], where: Path, gpu: bool) -> Path:
    """A Llama target with random weights (bf16 on GPU), saved to `where`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**shape, max_position_embeddings=4096, tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device("cuda" if gpu else "cpu"):
        model = LlamaForCausalLM(cfg)
    if gpu:
        model = model.to(torch.bfloat16)
    else:
        with torch.no_grad():  # sharper logits than the default init, so argmax targets are not near-ties
            model.lm_head.weight.mul_(20)
    model.save_pretrained(str(where))
    return where


def make_data(vocab: int, samples: int, seq_len: int, where: Path) -> Path:
    """A prepared dataset of random-token rows (lengths seq_len/2..seq_len), loss on all but 4 tokens."""
    import datasets
    import torch

    g = torch.Generator().manual_seed(0)
    lens = torch.randint(seq_len // 2, seq_len + 1, (samples,), generator=g).tolist()
    rows = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lens]
    datasets.Dataset.from_dict({"input_ids": rows, "loss_mask": [[0] * 4 + [1] * (len(r) - 4) for r in rows],
                                "seq_len": lens}).save_to_disk(str(where))
    return where


# ---------------------------------------------------------------- running the CLIs


def run_cli(args: list[str], nproc: int, gpu: bool, metrics: Path, log: Path) -> None:
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0", "RUNBOOK_METRICS": str(metrics), "PYTHONUNBUFFERED": "1"}
    if nproc == 1:
        cmd = [sys.executable, "-m", "eagle.cli", *args]
        if gpu:
            env["CUDA_VISIBLE_DEVICES"] = env.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    else:
        torchrun = Path(sys.executable).with_name("torchrun")
        cmd = [str(torchrun), "--nproc-per-node", str(nproc), "--master-port", str(free_port()), "-m", "eagle.cli", *args]
    if not gpu:  # one thread per process: a process stands for one device (2 threads on a busy box thrash)
        env["OMP_NUM_THREADS"] = "1"
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    log.write_text(f"$ {' '.join(cmd)}\n# {time.perf_counter() - t0:.1f} s, rc {res.returncode}\n"
                   f"{res.stdout}\n--- stderr\n{res.stderr}")
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])} ... failed (rc {res.returncode}); see {log}:\n{res.stderr[-3000:]}")


def bench_extract(target: Path, data: Path, work: Path, nproc: int, gpu: bool, batch_tokens: int) -> dict[str, Any]:
    out, metrics = work / f"extract-{nproc}", work / f"extract-{nproc}.metrics.json"
    args = ["extract", "--model", str(target), "--data", str(data), "--out", str(out), "--batch-tokens",
            str(batch_tokens), "--keep-free", "0"] + ([] if gpu else ["--device", "cpu"])
    run_cli(args, nproc, gpu, metrics, work / f"extract-{nproc}.log")
    m = json.loads(metrics.read_text())
    ranks = [k for k in range(nproc) if f"extract_rank{k}_tok_s" in m]
    return {"out": out, "tok_s": m["extract_tok_s"], "capture_tok_s": m["extract_capture_tok_s"],
            "tokens": m["extract_tokens"], "rank_tok_s": [m[f"extract_rank{k}_tok_s"] for k in ranks],
            "rank_capture_tok_s": [m[f"extract_rank{k}_capture_tok_s"] for k in ranks]}


def bench_train(target: Path, data: Path, work: Path, nproc: int, gpu: bool, a: argparse.Namespace) -> dict[str, Any]:
    out, metrics = work / f"train-{nproc}", work / f"train-{nproc}.metrics.json"
    args = ["train", "--model", str(target), "--data", str(data), "--out", str(out), "--epochs", str(a.epochs),
            "--batch-tokens", str(a.train_batch_tokens), "--val-fraction", "0.1", "--lr", str(a.lr)]
    args += [] if gpu else ["--device", "cpu"]
    t0 = time.perf_counter()
    run_cli(args, nproc, gpu, metrics, work / f"train-{nproc}.log")
    cli_s = time.perf_counter() - t0
    m = json.loads(metrics.read_text())
    log = json.loads((out / "train_log.json").read_text())
    last = log["epochs"][-1]
    return {"tok_s": last["train_tok_s"], "steps": sum(e["steps"] for e in log["epochs"]), "cli_s": cli_s,
            "last_epoch_s": last["seconds"], "epochs_s": sum(e["seconds"] for e in log["epochs"]),
            "val_loss": m.get("val_loss"), "val_acc": [m[k] for k in sorted(m) if k.startswith("val_acc_")],
            "world_size": log["args"]["world_size"]}


# ---------------------------------------------------------------- the table


def table(rows: list[dict[str, Any]] | None = None) -> str:
    """The rows (default: this bench's) as a plain-text table."""
    rows = ROWS if rows is None else rows
    w = max(len(r["name"]) for r in rows)
    lines = [f"{'measure':<{w}}  {'value':>14}  unit      note", "-" * (w + 40)]
    for r in rows:
        v = r["value"]
        text = f"{v:>14,.3f}" if isinstance(v, float) else f"{v!s:>14}"
        lines.append(f"{r['name']:<{w}}  {text}  {r['unit']:<8}  {r['note']}".rstrip())
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="Tiny shapes, CPU processes with gloo.")
    p.add_argument("--nproc", type=int, default=2, help="Processes (GPUs) for the parallel runs.")
    p.add_argument("--samples", type=int, default=None, help="Dataset rows [1024; smoke 24].")
    p.add_argument("--seq-len", type=int, default=None, help="Longest row [2048; smoke 48].")
    p.add_argument("--epochs", type=int, default=None, help="Training epochs [2; smoke 2].")
    p.add_argument("--train-batch-tokens", type=int, default=None, help="eagle train --batch-tokens [8192; smoke 96].")
    p.add_argument("--extract-batch-tokens", type=int, default=None, help="eagle extract --batch-tokens [16384; smoke 96].")
    p.add_argument("--draft-vocab", type=int, default=None, help="eagle vocab --draft-vocab [8000; smoke 64].")
    p.add_argument("--lr", type=float, default=None, help="eagle train --lr [3e-4: 3e-3 diverged to NaN on the "
                   "random-weight 1.1B target; smoke 3e-3: 20 steps at 3e-4 leave val_acc at 0].")
    p.add_argument("--workdir", type=Path, default=None, help="Keep the inputs and outputs here (default: a temp dir, removed).")
    p.add_argument("--out", type=Path, default=None, help="Write multi_gpu_scaling.json here [default: $OUT].")
    a = p.parse_args()
    d = {"samples": 24, "seq_len": 48, "epochs": 2, "train_batch_tokens": 96, "extract_batch_tokens": 96,
         "draft_vocab": 64, "lr": 3e-3} if a.smoke else {"samples": 1024, "seq_len": 2048, "epochs": 2,
                                                         "train_batch_tokens": 8192, "extract_batch_tokens": 16384,
                                                         "draft_vocab": 8000, "lr": 3e-4}
    for k, v in d.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    out = a.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else None)

    import torch

    gpu = not a.smoke
    if gpu and torch.cuda.device_count() < a.nproc:
        print(f"this machine has {torch.cuda.device_count()} GPUs; {a.nproc} are needed (or use --smoke on the CPU)",
              file=sys.stderr)
        return 2
    shape = SMOKE if a.smoke else TARGET_1B
    META.update({"smoke": a.smoke, "nproc": a.nproc, "shape": shape, "args": {k: str(v) for k, v in vars(a).items()},
                 "torch": torch.__version__, "cpus": os.cpu_count(),
                 "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
                 "NCCL_NVLS_ENABLE": "0"})
    work = a.workdir or Path(tempfile.mkdtemp(prefix="multi-gpu-scaling-"))
    work.mkdir(parents=True, exist_ok=True)
    n = a.nproc
    try:
        target = make_target(shape, work / "target", gpu)
        data = make_data(shape["vocab_size"], a.samples, a.seq_len, work / "data")
        if gpu:
            torch.cuda.empty_cache()

        ex1 = bench_extract(target, data, work, 1, gpu, a.extract_batch_tokens)
        tokens = ex1["tokens"]
        row(out, "extract capture tok/s (load excluded), 1 process", ex1["capture_tok_s"], "tok/s",
            f"{tokens:,} tokens in {tokens / ex1['capture_tok_s']:,.1f} s of capture")
        row(out, "extract tok/s (load included), 1 process", ex1["tok_s"], "tok/s",
            f"{tokens / ex1['tok_s']:,.1f} s from before the model load")
        exn = bench_extract(target, data, work, n, gpu, a.extract_batch_tokens)
        row(out, f"extract capture tok/s (load excluded), {n} processes", exn["capture_tok_s"], "tok/s",
            f"{tokens / exn['capture_tok_s']:,.1f} s (slowest rank); per rank "
            + " ".join(f"{t:,.0f}" for t in exn["rank_capture_tok_s"]))
        row(out, f"extract tok/s (load included), {n} processes", exn["tok_s"], "tok/s",
            f"{tokens / exn['tok_s']:,.1f} s (slowest rank); per rank " + " ".join(f"{t:,.0f}" for t in exn["rank_tok_s"]))
        row(out, "extract scaling efficiency (capture)", exn["capture_tok_s"] / (n * ex1["capture_tok_s"]), "x",
            f"capture tok/s({n}) / ({n} x capture tok/s(1))")
        row(out, "extract scaling efficiency (load included)", exn["tok_s"] / (n * ex1["tok_s"]), "x",
            f"tok/s({n}) / ({n} x tok/s(1))")
        files1 = sorted(p.name for p in (ex1["out"] / "hidden_states").glob("hs_*.safetensors"))
        filesn = sorted(p.name for p in (exn["out"] / "hidden_states").glob("hs_*.safetensors"))
        row(out, "extract: same files from both runs", str(files1 == filesn and len(files1) == a.samples), "",
            f"{len(filesn)} of {a.samples} samples")
        shutil.rmtree(exn["out"])  # large on the GPU shape; training reads the 1-process extraction

        from eagle.vocab import build_vocab

        build_vocab(data=ex1["out"], draft_vocab=a.draft_vocab)
        tr1 = bench_train(target, ex1["out"], work, 1, gpu, a)
        row(out, "train tok/s, 1 process", tr1["tok_s"], "tok/s", f"last of {a.epochs} epochs, {tr1['steps']} steps")
        trn = bench_train(target, ex1["out"], work, n, gpu, a)
        row(out, f"train tok/s, {n} processes", trn["tok_s"], "tok/s",
            f"last of {a.epochs} epochs, {trn['steps']} steps (world {trn['world_size']})")
        row(out, "train scaling efficiency", trn["tok_s"] / (n * tr1["tok_s"]), "x", f"tok/s({n}) / ({n} x tok/s(1))")
        for name, r in (("1 process", tr1), (f"{n} processes", trn)):
            row(out, f"train CLI wall seconds vs last epoch, {name}", float(r["cli_s"]), "s",
                f"last epoch {r['last_epoch_s']:,.1f} s, all {a.epochs} epochs {r['epochs_s']:,.1f} s; the rest: "
                "start-up, load, compile, validation, saving")
        for name, r in (("1 process", tr1), (f"{n} processes", trn)):
            row(out, f"val_loss, {name}", float(r["val_loss"]), "", "best epoch")
            row(out, f"val_acc, {name}", " ".join(f"{x:.3f}" for x in r["val_acc"]), "", "steps 0..k-1, best epoch")
        row(out, "val_acc_0 difference", float(trn["val_acc"][0] - tr1["val_acc"][0]), "", f"{n} processes minus 1")
    except Exception as e:  # keep what was measured; say what failed
        META["error"] = f"{type(e).__name__}: {e}"
        save(out)
        print(table() if ROWS else "", file=sys.stdout)
        print(f"\nFAILED: {META['error']}", file=sys.stderr)
        return 1
    finally:
        if a.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(table())
    if a.smoke:
        print(f"\n(smoke: {n} CPU processes on {os.cpu_count()} shared cores; checks the code paths, not GPU scaling)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`eagle train --online` against the offline path (`eagle extract` files + `eagle train`): one call, one table.

    python -m bench.online_training                 # on the H200: 1.1B Llama shape (random bf16) + the toy target
    python -m bench.online_training --smoke         # tiny shapes on the CPU (a check of the code, not a number)

Runs the real CLIs in subprocesses (bench/multi_gpu_scaling.py's helpers), in this order:
1. Speed, on a random-weight target (1.1B Llama shape on the GPU) and random-token rows (lengths
   seq_len/2..seq_len): the capture engine's compute-only rate in this process (eagle/data/capture.py,
   no files, second pass after a warm-up pass); `eagle extract` to files; `eagle vocab`; `eagle train`
   offline and `eagle train --online`, the same epochs, batch, seed and learning rate.
   tok/s of training is the last epoch's train_tok_s (epoch 1 carries torch.compile's warm-up); the
   online run's limit is the two measured rates in series, 1 / (1/offline train + 1/capture): the
   online loop does a target forward and a drafter step for every batch, on one stream.
   End to end: seconds from the first CLI start to the drafter on disk (offline: extract + vocab +
   train; online: vocab + train), so what each path costs for that many epochs.
2. Accuracy, on the trained toy target and its regenerated prompts (--toy-target, --toy-data: a
   prepared data dir): offline and online training with the same settings; the best epoch's per-step
   validation accuracies and val_accept_len of each (the "same accuracy on the same data" check).
Prints one table; writes OUT/online_training.json after every row (OUT: --out, else $OUT).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import REPO, free_port, rows_table, write_json
from bench.shapes import SMOKE_CLI, TARGET_1B, make_data, make_target

ROWS: list[dict[str, Any]] = []


def run_cli(args: list[str], nproc: int, gpu: bool, metrics: Path, log: Path) -> None:
    """`eagle ARGS` in 1 process or under torchrun, its metrics into `metrics`, its output into `log`."""
    import subprocess

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
META: dict[str, Any] = {}


def row(out: Path | None, name: str, value: float | str, unit: str = "", note: str = "") -> None:
    ROWS.append({"name": name, "value": value, "unit": unit, "note": note})
    print(f"  {name}: {value} {unit} {note}".rstrip(), file=sys.stderr, flush=True)
    write_json(out, "online_training.json", {"meta": META, "rows": ROWS})


def table() -> str:
    return rows_table(ROWS)


def capture_rate(target: Path, data: Path, gpu: bool, batch_tokens: int) -> float:
    """Compute-only tok/s of the capture engine (the online loop's target forward), after a warm-up pass."""
    import torch

    from eagle.data.capture import extract_rows
    from eagle.data.hidden_io import open_prepared
    from eagle.target import default_layer_ids, load_model

    model = load_model(target, "cuda" if gpu else "cpu")
    rows = list(open_prepared(data).with_format(None)["input_ids"])
    ids = default_layer_ids(model.config.num_hidden_layers)
    todo = list(range(len(rows)))
    extract_rows(model, rows, todo[: max(8, len(todo) // 4)], ids, None, batch_tokens=batch_tokens)
    stats = extract_rows(model, rows, todo, ids, None, batch_tokens=batch_tokens)
    del model
    if gpu:
        torch.cuda.empty_cache()
    return stats.tok_s


def train_run(target: Path, data: Path, out: Path, gpu: bool, extra: list[str]) -> dict[str, Any]:
    metrics = out.with_suffix(".metrics.json")
    t0 = time.perf_counter()
    run_cli(["train", "--model", str(target), "--data", str(data), "--out", str(out), *extra]
            + ([] if gpu else ["--device", "cpu"]), 1, gpu, metrics, out.with_suffix(".log"))
    wall = time.perf_counter() - t0
    log = json.loads((out / "train_log.json").read_text())
    m = json.loads(metrics.read_text())
    last = log["epochs"][-1]
    text = out.with_suffix(".log").read_text()
    return {"wall": wall, "tok_s": last["train_tok_s"], "epochs": len(log["epochs"]), "step_ms": last["step_ms"],
            "wait": last.get("data_wait_s", 0.0) / last["seconds"], "recompiles": text.count("Recompiling function"),
            "target": (last["target_s"] / last["seconds"]) if last.get("target_s") is not None else None,
            "val_acc": [m[k] for k in sorted(m) if k.startswith("val_acc_")], "val_loss": m.get("val_loss"),
            "est": m.get("val_accept_len"), "seconds": sum(e["seconds"] for e in log["epochs"])}


def cli(args: list[str], gpu: bool, work: Path, name: str) -> tuple[float, dict[str, Any]]:
    metrics = work / f"{name}.metrics.json"
    t0 = time.perf_counter()
    device = ["--device", "cpu"] if not gpu and args[0] == "extract" else []
    run_cli(args + device, 1, gpu, metrics, work / f"{name}.log")
    return time.perf_counter() - t0, json.loads(metrics.read_text()) if metrics.exists() else {}


def speed(a: argparse.Namespace, gpu: bool, work: Path, out: Path | None) -> None:
    shape = SMOKE_CLI if a.smoke else TARGET_1B
    target = make_target(shape, work / "target", gpu)
    data = make_data(shape["vocab_size"], a.samples, a.seq_len, work / "data")
    cap = capture_rate(target, data, gpu, a.extract_batch_tokens)
    row(out, "capture compute-only (target forward)", cap, "tok/s", "in-process, 2nd pass, no files")

    t_ex, m_ex = cli(["extract", "--model", str(target), "--data", str(data), "--batch-tokens",
                      str(a.extract_batch_tokens), "--keep-free", "0"], gpu, work, "extract")
    row(out, "eagle extract to files", float(m_ex["extract_tok_s"]), "tok/s",
        f"{m_ex['extract_tokens']:,} tokens, {m_ex['extract_bytes'] / 1e9:.1f} GB, incl. model load")
    t_vocab, _ = cli(["vocab", "--data", str(data), "--draft-vocab", str(a.draft_vocab)], gpu, work, "vocab")
    common = ["--epochs", str(a.epochs), "--batch-tokens", str(a.train_batch_tokens), "--lr", str(a.lr),
              "--val-fraction", "0.05"]
    off = train_run(target, data, work / "train-offline", gpu, common)
    row(out, "eagle train (offline, files)", off["tok_s"], "tok/s",
        f"last of {off['epochs']} epochs; {off['step_ms']:.0f} ms/step, waiting for data {off['wait']:.0%}")
    os.environ["TORCH_LOGS"] = "recompiles"  # counted in the online run's log
    try:
        on = train_run(target, data, work / "train-online", gpu, [*common, "--online"])
    finally:
        os.environ.pop("TORCH_LOGS", None)
    bound = 1 / (1 / off["tok_s"] + 1 / cap)
    row(out, "eagle train --online", on["tok_s"], "tok/s",
        f"{on['tok_s'] / off['tok_s']:.2f}x offline; {on['tok_s'] / bound:.0%} of the series bound {bound:,.0f}")
    row(out, "--online step split", f"{on['step_ms']:.0f} ms", "",
        f"target forward {on['target'] or 0:.0%}, waiting for data {on['wait']:.0%}, "
        f"the rest drafter step; {on['recompiles']} recompiles logged")
    row(out, f"end to end, {a.epochs} epochs, offline", t_ex + t_vocab + off["wall"], "s",
        f"extract {t_ex:.1f} + vocab {t_vocab:.1f} + train {off['wall']:.1f}")
    row(out, f"end to end, {a.epochs} epochs, online", t_vocab + on["wall"], "s",
        f"vocab {t_vocab:.1f} + train {on['wall']:.1f}; disk written 0 GB")
    row(out, "val_acc (random target) offline / online",
        " / ".join(" ".join(f"{x:.3f}" for x in r["val_acc"]) for r in (off, on)), "", "best epoch")
    shutil.rmtree(data / "hidden_states", ignore_errors=True)


def accuracy(a: argparse.Namespace, gpu: bool, work: Path, out: Path | None) -> None:
    data = work / "toy-data"
    shutil.copytree(a.toy_data, data)
    t_ex, _ = cli(["extract", "--model", str(a.toy_target), "--data", str(data)], gpu, work, "toy-extract")
    cli(["vocab", "--data", str(data), "--draft-vocab", str(a.toy_draft_vocab)], gpu, work, "toy-vocab")
    common = ["--epochs", str(a.toy_epochs), "--batch-tokens", str(a.toy_batch_tokens)]
    off = train_run(a.toy_target, data, work / "toy-offline", gpu, common)
    on = train_run(a.toy_target, data, work / "toy-online", gpu, [*common, "--online"])
    for name, r in (("offline", off), ("online", on)):
        row(out, f"toy target, {name}: val_acc", " ".join(f"{x:.3f}" for x in r["val_acc"]), "",
            f"val_accept_len {r['est']:.3f}, val_loss {r['val_loss']:.4f}, {r['tok_s']:,.0f} tok/s")
    row(out, "toy target: val_accept_len online - offline", float(on["est"] - off["est"]), "",
        f"{a.toy_epochs} epochs, batch {a.toy_batch_tokens}, same seed and rows")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="Tiny shapes on the CPU.")
    p.add_argument("--samples", type=int, default=None, help="Random rows for the speed part [256; smoke 24].")
    p.add_argument("--seq-len", type=int, default=None, help="Longest row [2048; smoke 48].")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--train-batch-tokens", type=int, default=None, help="[8192; smoke 96]")
    p.add_argument("--extract-batch-tokens", type=int, default=None, help="[16384; smoke 96]")
    p.add_argument("--draft-vocab", type=int, default=None, help="[8000; smoke 64]")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--toy-target", type=Path, default=None, help="A trained toy target dir (skip part 2 if absent).")
    p.add_argument("--toy-data", type=Path, default=None, help="Its prepared data dir (eagle prepare).")
    p.add_argument("--toy-epochs", type=int, default=12)
    p.add_argument("--toy-batch-tokens", type=int, default=256)
    p.add_argument("--toy-draft-vocab", type=int, default=256)
    p.add_argument("--workdir", type=Path, default=None, help="Keep inputs and outputs here (default: a temp dir).")
    p.add_argument("--out", type=Path, default=None, help="Write online_training.json here [default: $OUT].")
    a = p.parse_args()
    d = ({"samples": 24, "seq_len": 48, "train_batch_tokens": 96, "extract_batch_tokens": 96, "draft_vocab": 64}
         if a.smoke else {"samples": 256, "seq_len": 2048, "train_batch_tokens": 8192, "extract_batch_tokens": 16384,
                          "draft_vocab": 8000})
    for k, v in d.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    out = a.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else None)

    import torch

    gpu = not a.smoke and torch.cuda.is_available()
    if not a.smoke and not gpu:
        print("no GPU here: use --smoke for a CPU check of the code", file=sys.stderr)
        return 2
    META.update({"smoke": a.smoke, "args": {k: str(v) for k, v in vars(a).items()}, "torch": torch.__version__,
                 "gpu": torch.cuda.get_device_name(0) if gpu else None, "date": time.strftime("%Y-%m-%d")})
    work = a.workdir or Path(tempfile.mkdtemp(prefix="online-training-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        speed(a, gpu, work, out)
        if a.toy_target and a.toy_data:
            accuracy(a, gpu, work, out)
    except Exception as e:  # keep what was measured; say what failed
        META["error"] = f"{type(e).__name__}: {e}"
        row(out, "FAILED", META["error"][:300])
        print(table(), file=sys.stdout)
        return 1
    finally:
        if a.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`eagle train` at the K2 drafter shape as a user runs it: files on disk, the CLI in its own process (issue 52).

    python -m bench.k2_train_cli --out $OUT                       # on the H200
    python -m bench.k2_train_cli --smoke                          # tiny widths on the CPU (checks, no numbers)
    python -m bench.k2_train_cli --batch-tokens 16384,65536 ...   # the ladder of --batch-tokens to try

What it writes (in --workdir, default a temp dir), then trains on:
  target/  Kimi-K2's config (all 61 layers; bench.shapes.K2) and the three tensors a drafter reads from its
           target (embed_tokens and lm_head 163,840 x 7168, the final norm; random bf16): all that `eagle train`
           opens of a real K2 checkpoint, under the tensor names of its shards.
  data/    --rows rows of --seq tokens (random ids) as `eagle prepare` writes them, and their hidden states as
           `eagle extract` writes them (aux layers 2, 30, 58 and the last, width 7168, random N(0, 1) bf16:
           values do not change a step's cost), then `eagle vocab --draft-vocab 32000`.
Then, for each --batch-tokens B, smallest first: `eagle train --epochs --batch-tokens B --json` on the GPU, timed
from the outside: process wall; the time to its "training N parameters" line (imports, target rows, data) and
to its "warm-up: ..." line (every pack shape compiled), each as it arrives on stderr; time to step 1 (the warm-up
line plus one step); steady tok/s and step time (the epochs after the first), MFU against the measured bf16
matmul rate; the process's peak GPU memory (nvidia-smi, polled every 0.2 s). The first B that fails ends the
ladder with its cause; the largest B that trained is the last row.
Writes OUT/k2_train_cli.json and OUT/k2_train_cli.md (after every row).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

from bench.harness import Table, bench_device, eagle_cli, matmul_rate
from bench.shapes import (
    K2,
    K2_DRAFT_VOCAB,
    K2_LAYERS,
    TINY,
    drafter_flops_per_token,
    make_rows,
    save_verifier_files,
)

K2_AUX = [2, 30, 58]  # eagle's default aux layers for a 61-layer target
TABLE = Table("k2_train_cli")


def make_target(shape: dict[str, Any], where: Path, dev: torch.device, dtype: torch.dtype) -> Path:
    """Kimi-K2's config with all its layers, and the drafter's three target tensors (random)."""
    from transformers import DeepseekV3Config

    cfg = DeepseekV3Config(**{**shape, "num_hidden_layers": K2_LAYERS})
    g = torch.Generator(device=dev).manual_seed(0)
    h, v = shape["hidden_size"], shape["vocab_size"]
    save_verifier_files(cfg, torch.randn(v, h, generator=g, device=dev).mul_(0.02).to(dtype),
                        torch.randn(v, h, generator=g, device=dev).mul_(0.02).to(dtype),
                        torch.ones(h, device=dev, dtype=dtype), where)
    return where


def make_data(shape: dict[str, Any], target: Path, where: Path, rows: int, seq: int) -> Path:
    """`rows` rows of `seq` tokens with their hidden states, as prepare and extract write them; the vocab."""
    from eagle.data import hidden_io

    make_rows(shape["vocab_size"], [seq] * rows, where, seed=1)
    ids = hidden_io.prepared_rows(where)[0]
    g = torch.Generator().manual_seed(2)
    for i, row in enumerate(ids):
        hs = torch.randn(seq, len(K2_AUX) + 1, shape["hidden_size"], generator=g).to(torch.bfloat16)
        hidden_io.write_sample(where, i, hs, torch.tensor(row))
    hidden_io.write_data_meta(where, hidden_io.DataMeta(
        target=str(target), layer_ids=K2_AUX, hidden_size=shape["hidden_size"], vocab_size=shape["vocab_size"],
        num_layers=K2_LAYERS, num_samples=rows, target_fingerprint=hidden_io.model_fingerprint(target)))
    return where


def gpu_memory_mib(pid: int) -> float | None:
    """The GPU memory nvidia-smi reports for `pid` (its allocator's reservations and the CUDA context), or None."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid):
            return float(parts[1])
    return None


def train_once(target: Path, data: Path, out: Path, batch_tokens: int, epochs: int, cuda: bool,
               timeout: float) -> dict[str, Any]:
    """One `eagle train` process, timed from the outside (see the module's docstring)."""
    t0 = time.perf_counter()
    proc = eagle_cli("train", "--model", str(target), "--data", str(data), "--out", str(out), "--epochs", str(epochs),
                 "--batch-tokens", str(batch_tokens), "--no-tensorboard", "--device", "cuda" if cuda else "cpu",
                 "--json")
    marks: dict[str, float] = {}
    tail: list[str] = []
    peak = [0.0]
    done = threading.Event()

    def read_stderr() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            now = time.perf_counter() - t0
            tail.append(line.rstrip())
            del tail[:-30]
            for mark in ("training ", "warm-up: "):
                if line.startswith(mark) and mark not in marks:
                    marks[mark] = now

    def poll_memory() -> None:
        while cuda and not done.wait(0.2):
            mib = gpu_memory_mib(proc.pid)
            if mib is not None:
                peak[0] = max(peak[0], mib)

    printed: list[str] = []

    def read_stdout() -> None:  # on a thread, so that the wait below can time out
        assert proc.stdout is not None
        printed.append(proc.stdout.read())

    threads = [threading.Thread(target=f, daemon=True) for f in (read_stderr, read_stdout, poll_memory)]
    for t in threads:
        t.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    done.set()
    for t in threads:
        t.join(timeout=5)
    stdout = "".join(printed)
    wall = time.perf_counter() - t0
    res: dict[str, Any] = {"batch_tokens": batch_tokens, "rc": proc.returncode, "wall_s": wall,
                           "to_training_s": marks.get("training "), "to_warmed_s": marks.get("warm-up: "),
                           "peak_gib": peak[0] / 1024 if peak[0] else None, "tail": tail[-8:]}
    log_file = out / "train_log.json"
    if proc.returncode == 0 and log_file.is_file():
        log = json.loads(log_file.read_text())
        res["epochs"] = log["epochs"]
        res["warmup"] = log.get("warmup")
        res["metrics"] = json.loads(stdout) if stdout.strip().startswith("{") else {}
    return res


def report(res: dict[str, Any], shape: dict[str, Any], seq: int, rate: float | None) -> None:
    b = res["batch_tokens"]
    epochs = res["epochs"]
    steady = epochs[1:] or epochs
    tok_s = sum(e["train_tok_s"] * e["seconds"] for e in steady) / max(sum(e["seconds"] for e in steady), 1e-9)
    step_ms = sum(e["step_ms"] * e["steps"] for e in steady) / max(sum(e["steps"] for e in steady), 1)
    h = shape["hidden_size"]
    flops = drafter_flops_per_token(h, shape["intermediate_size"], shape["num_attention_heads"],
                                    shape["num_key_value_heads"], K2_DRAFT_VOCAB["gpu" if h == K2["hidden_size"] else "smoke"],
                                    3, seq)
    warmed = res["to_warmed_s"] if res["to_warmed_s"] is not None else res["to_training_s"]
    TABLE.row(f"B={b}: process start to 'training ...' (imports, target rows, data)", res["to_training_s"] or 0.0, "s")
    if res["to_warmed_s"] is not None:
        w = res.get("warmup") or {}
        TABLE.row(f"B={b}: to the end of warm-up", res["to_warmed_s"], "s",
                  note=f"{w.get('train_shapes')} training + {w.get('val_shapes')} validation shapes in {w.get('seconds', 0):.1f} s")
    TABLE.row(f"B={b}: time to step 1", (warmed or 0.0) + step_ms / 1000, "s", note="warm-up line + one steady step")
    TABLE.row(f"B={b}: steady training", tok_s, "tok/s", limit=("matmul rate", rate / flops) if rate else None,
              note=f"step {step_ms:.0f} ms, {len(steady)} epoch(s){' after the first' if len(epochs) > 1 else ''}, "
                   f"{steady[-1]['steps']} steps each")
    if res["peak_gib"] is not None:
        TABLE.row(f"B={b}: peak GPU memory of the process", res["peak_gib"], "GiB", note="nvidia-smi, polled every 0.2 s")
    TABLE.row(f"B={b}: whole process", res["wall_s"], "s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny widths on the CPU: checks the code path, measures nothing")
    p.add_argument("--out", default=os.environ.get("OUT"), help="write k2_train_cli.json/.md here [$OUT]")
    p.add_argument("--workdir", default=None, help="where target/ and data/ go (default: a temp dir)")
    p.add_argument("--rows", type=int, default=32, help="rows of training data")
    p.add_argument("--seq", type=int, default=2047, help="tokens a row")
    p.add_argument("--epochs", type=int, default=2, help="epochs a process trains (the first carries compilation)")
    p.add_argument("--batch-tokens", default=None, help="comma list, tried smallest first [16384,32768,65536; "
                   "--smoke: 64,128]")
    p.add_argument("--timeout", type=float, default=420.0, help="seconds one eagle train may take")
    a = p.parse_args(argv)
    dev = bench_device(a.smoke)
    if dev is None:
        return 1
    shape = TINY if a.smoke else K2
    rows, seq = (8, 64) if a.smoke else (a.rows, a.seq)
    ladder = sorted(int(x) for x in (a.batch_tokens or ("64,128" if a.smoke else "16384,32768,65536")).split(","))
    work = Path(a.workdir or tempfile.mkdtemp(prefix="k2_train_cli-"))
    TABLE.out = Path(a.out) if a.out else None
    TABLE.rows.clear()
    TABLE.stamp(dev, hidden=shape["hidden_size"], vocab=shape["vocab_size"], draft_vocab=K2_DRAFT_VOCAB["smoke" if a.smoke
                else "gpu"], rows=rows, seq=seq, ladder=ladder)
    print(f"# k2_train_cli {TABLE.meta}", flush=True)
    rate = None if a.smoke else matmul_rate(dev, 8192)
    try:
        t0 = time.perf_counter()
        target = make_target(shape, work / "target", dev, torch.float32 if a.smoke else torch.bfloat16)
        data = make_data(shape, target, work / "data", rows, seq)
        vocab = eagle_cli("vocab", "--data", str(data), "--draft-vocab", str(K2_DRAFT_VOCAB["smoke" if a.smoke else "gpu"]))
        _, err = vocab.communicate()
        if vocab.returncode != 0:
            raise RuntimeError(f"eagle vocab failed: {err[-500:]}")
        if dev.type == "cuda":
            torch.cuda.empty_cache()  # the children train on the whole device (the first run's parent kept 9.7 GiB)
        TABLE.row("target files, data files and vocab written", time.perf_counter() - t0, "s",
                  note=f"{sum(f.stat().st_size for f in work.rglob('*') if f.is_file()) / 1e9:.1f} GB")
    except Exception as e:  # noqa: BLE001
        TABLE.failed("files", e)
        return 2
    largest = None
    for b in ladder:
        res = train_once(target, data, work / f"draft-{b}", b, a.epochs, dev.type == "cuda", a.timeout)
        if res["rc"] != 0:
            cause = next((line for line in reversed(res["tail"]) if line.strip()), "no output")
            TABLE.rows.append({"name": f"B={b}: eagle train", "value": None, "unit": "",
                               "note": f"FAILED (exit {res['rc']}) after {res['wall_s']:.0f} s: {cause[:200]}"})
            TABLE.save()
            print(f"  B={b}: FAILED: {cause}", flush=True)
            break
        report(res, shape, seq, rate)
        largest = b
    if largest is not None:
        TABLE.row("largest --batch-tokens that trained", largest, "tokens",
                  note=f"of {ladder}" + ("" if largest == ladder[-1] else ": the next one failed (above)"))
    TABLE.save()
    print("\n" + TABLE.markdown())
    return 0 if largest is not None else 2


if __name__ == "__main__":
    sys.exit(main())

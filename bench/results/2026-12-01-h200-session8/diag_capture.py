"""Run on the H200 in session 8 (calls 2-3, before formatting): where the step's CUDA graph capture fails."""

import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

import torch


def main(mode: str) -> None:
    from bench.gpu_throughput import SMOKE, random_target, save_verifier
    from bench.train_step_kernels import samples
    from eagle.drafter.model import model as drafter
    from eagle.train.trainer import (
        backward_step,
        compile_settings,
        dataset,
        graphed_train_step,
        use_doc_attention,
    )

    compile_settings()
    drafter.use_sync_free_metrics()
    dev = torch.device("cuda")
    d = Path(tempfile.mkdtemp())
    t = random_target(SMOKE, dev, torch.bfloat16)
    save_verifier(t, d / "v")
    del t
    dv = 64
    d2t = torch.zeros(dv, dtype=torch.long)
    t2d = torch.zeros(SMOKE["vocab_size"], dtype=torch.bool)
    t2d[:dv] = True
    model = drafter.build_drafter(d / "v", layer_ids=[2, 4, 5], d2t=d2t, t2d=t2d, ttt_steps=3).to(dev)
    use_doc_attention(model)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=3e-3, betas=(0.9, 0.95), weight_decay=0.0)
    losses = drafter.loss_config()
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False)
    raw = samples(SMOKE, [40, 50, 30], 3)
    batch = dataset.to_device(
        dataset.collate(
            [dataset.shift_sample(s, 126) for s in raw],
            dtype=torch.bfloat16,
            layout=True,
            pin=True,
            layout_multiple=64,
            pad_to=126,
        ),
        dev,
    )
    if mode == "step":
        g = graphed_train_step(model, opt, params, 3, losses, autocast)
        ok = g.capture(batch)
        print("CAPTURED" if ok else "FAILED", flush=True)
        for f in g.failures:
            print(f[-6000:])
        if ok:
            a = [float(g(batch)[0]) for _ in range(3)]
            print("losses", a)
        return
    backward_step(model, batch, 3, losses, autocast)
    [setattr(p, "grad", None) for p in params]
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            if mode == "fwd":
                with torch.no_grad(), autocast:
                    from eagle.train.trainer import forward

                    forward(model, batch, 3, losses)
            elif mode == "fwdbwd":
                backward_step(model, batch, 3, losses, autocast)
            elif mode == "opt":
                for p in params:
                    p.grad = torch.ones_like(p)
        print(mode, "CAPTURED")
    except Exception:
        print(mode, "FAILED")
        print(traceback.format_exc()[-5000:])


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        for m in ("step", "fwdbwd", "fwd"):
            r = subprocess.run([sys.executable, __file__, m], capture_output=True, text=True, timeout=200)
            out = "\n".join(
                line
                for line in (r.stdout + r.stderr).splitlines()
                if not line.startswith(("DEBUG", "W1", "WARNING", "I1"))
            )
            print(f"===== {m} rc={r.returncode}\n{out[-7000:]}", flush=True)

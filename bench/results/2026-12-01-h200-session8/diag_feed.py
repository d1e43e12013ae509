"""Run on the H200 in session 8 (call 4, before formatting): why the graphed step fed by the loader is slower."""

import tempfile
import time
from pathlib import Path

import torch

from bench.gpu_decode import sync
from bench.gpu_throughput import TARGET_1B, random_target, save_verifier
from bench.train_step_kernels import samples
from eagle.drafter.model import model as drafter
from eagle.train.trainer import (
    compile_settings,
    dataset,
    graphed_train_step,
    lr_lambda,
    train_step,
    use_doc_attention,
)

dev = torch.device("cuda")
compile_settings()
drafter.use_sync_free_metrics()
shape, seq, dv, per_pack, ttt = TARGET_1B, 2048, 8000, 4, 3
scratch = Path(tempfile.mkdtemp())
t = random_target(shape, dev, torch.bfloat16)
save_verifier(t, scratch / "v")
del t
raw = samples(shape, [seq] * 8, 3)
budget = per_pack * (seq - 1)
shifted = [dataset.shift_sample(s, budget) for s in raw]
order = [[(k * per_pack + j) % 8 for j in range(per_pack)] for k in range(34)]
d2t = torch.zeros(dv, dtype=torch.long)
t2d = torch.zeros(shape["vocab_size"], dtype=torch.bool)
t2d[:dv] = True
torch.manual_seed(0)
model = drafter.build_drafter(scratch / "v", layer_ids=[2, 11, 19], d2t=d2t, t2d=t2d, ttt_steps=ttt).to(dev)
use_doc_attention(model)
model.train()
params = [p for p in model.parameters() if p.requires_grad]
opt = torch.optim.AdamW(params, lr=3e-3, betas=(0.9, 0.95), weight_decay=0.0)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(1000, 10))
losses = drafter.loss_config()
ac = torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False)


def host(idx):
    return dataset.collate([shifted[i] for i in idx], dtype=torch.bfloat16, layout=True, pin=True)


pre = [host(idx) for idx in order]
resident = [{k: v.to(dev) for k, v in b.items()} for b in pre]
for b in resident[:3]:
    train_step(model, b, opt, sched, params, ttt, losses, ac)
g = graphed_train_step(model, opt, params, ttt, losses, ac)
g.capture(resident[0])
print("captured", g.captured, g.failures[:1], flush=True)


def timed(label, batches, graphs=True):
    sync(dev)
    t0 = time.perf_counter()
    n = 0
    for b in batches:
        if graphs:
            g(b)
            sched.step()
        else:
            train_step(model, b, opt, sched, params, ttt, losses, ac)
        n += 1
    sync(dev)
    ms = (time.perf_counter() - t0) / n * 1000
    print(f"{label:60s} {ms:7.2f} ms/step ({n} steps)", flush=True)


items = list(range(4, 34))
timed("graphs, device-resident", (resident[i] for i in items))
timed("graphs, threads handing resident batches (w2)", dataset.prefetched(lambda i: resident[i], items, 2))
timed(
    "graphs, pre-collated pinned, to_device in threads (w2)",
    dataset.prefetched(lambda i: dataset.to_device(pre[i], dev), items, 2),
)
timed(
    "graphs, collate + to_device in threads (w2)",
    dataset.prefetched(lambda i: dataset.to_device(host(order[i]), dev), items, 2),
)
timed(
    "graphs, collate + to_device in threads (w4)",
    dataset.prefetched(lambda i: dataset.to_device(host(order[i]), dev), items, 4),
)
sync(dev)
t0 = time.perf_counter()
for _ in dataset.prefetched(lambda i: dataset.to_device(host(order[i]), dev), items, 2):
    pass
print(f"{'loader alone (w2)':60s} {(time.perf_counter() - t0) / len(items) * 1000:7.2f} ms/batch", flush=True)
sync(dev)
t0 = time.perf_counter()
for i in items:
    host(order[i])
print(
    f"{'collate alone, main thread':60s} {(time.perf_counter() - t0) / len(items) * 1000:7.2f} ms/batch",
    flush=True,
)
timed(
    "eager (sync-free), collate + to_device in threads (w2)",
    dataset.prefetched(lambda i: dataset.to_device(host(order[i]), dev), items, 2),
    graphs=False,
)
timed("eager (sync-free), device-resident", (resident[i] for i in items), graphs=False)

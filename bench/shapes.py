"""The shapes, targets and data the bench scripts share: the 1.1B and 8B Llama shapes with their
smoke (CPU) stand-ins, random-weight targets (in memory or saved), the drafter the training benches
build, the FLOP counts their rooflines and MFUs divide by, random samples and prepared datasets.

Imports bench.harness (to run `eagle` for the prepared data), no script. torch, transformers and
eagle are imported inside the functions that need them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.harness import Table, eagle_cli, finish, sync

if TYPE_CHECKING:
    import torch

# the extraction and training benches' target: TinyLlama-1.1B's shape
TARGET_1B = {"hidden_size": 2048, "num_hidden_layers": 22, "intermediate_size": 5632, "vocab_size": 32000,
             "num_attention_heads": 32, "num_key_value_heads": 4}
# its stand-in for the in-process benches' --smoke (gpu_throughput, train_step_kernels, extract_*, *_feed)
SMOKE = {"hidden_size": 64, "num_hidden_layers": 8, "intermediate_size": 128, "vocab_size": 512,
         "num_attention_heads": 4, "num_key_value_heads": 2}
# its stand-in for the benches that run eagle's CLI in children (train_real_loop, multi_gpu_scaling,
# online_training, train_step_profile): smaller still, several processes share two CPU cores
SMOKE_CLI = {"hidden_size": 32, "num_hidden_layers": 8, "intermediate_size": 64, "vocab_size": 128,
             "num_attention_heads": 4, "num_key_value_heads": 2}
# the decode benches' target: Llama-3-8B's shape (vocab 32000), and gpu_decode's --smoke stand-in
LLAMA_8B = {"hidden_size": 4096, "num_hidden_layers": 32, "intermediate_size": 14336, "vocab_size": 32000,
            "num_attention_heads": 32, "num_key_value_heads": 8}
SMOKE_8B = {"hidden_size": 128, "num_hidden_layers": 4, "intermediate_size": 256, "vocab_size": 1000,
            "num_attention_heads": 4, "num_key_value_heads": 2}

# Kimi-K2's config.json numbers (moonshotai/Kimi-K2-Instruct; Kimi-K2.5's text model is the same), cut to 3 layers
K2 = {"hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048, "n_routed_experts": 384,
      "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.827,
      "norm_topk_prob": True, "num_attention_heads": 64, "num_key_value_heads": 64, "q_lora_rank": 1536,
      "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 163840,
      "num_hidden_layers": 3, "first_k_dense_replace": 1}
K2_LAYERS = 61  # the whole target: 1 dense + 60 MoE layers
# its stand-in for k2_slice's and k2_train_cli's --smoke: the same code path at tiny widths
TINY = {**K2, "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32, "n_routed_experts": 8,
        "num_experts_per_tok": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 32,
        "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "vocab_size": 512}
# the K2 drafter's draft vocabulary (AQ-MedAI's K2 drafter), and the smoke runs'
K2_DRAFT_VOCAB = {"gpu": 32000, "smoke": 64}

# `eagle train`'s arguments in the real-loop and multi-GPU benches, on the GPU and in --smoke
TTT = 3
VAL_FRACTION = 0.05
BATCH_TOKENS = {"gpu": 8192, "smoke": 96}
LR = {"gpu": 2e-4, "smoke": 3e-3}  # eagle.train.trainer.default_lr of the 1.1B shape; the smoke's tiny shape needs more
EXTRACT_BATCH = {"gpu": 16384, "smoke": 96}  # `eagle extract --batch-tokens`


# ---------------------------------------------------------------- targets
def random_hf(model_class: Any, cfg: Any, dev: torch.device, dtype: torch.dtype) -> Any:
    """A transformers model of `cfg` built on `dev` in `dtype` directly (no float32 copy of large
    weights), matrices drawn from N(0, 0.02) after seed 0; in eval mode."""
    import torch

    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(dev):
            model = model_class(cfg)
    finally:
        torch.set_default_dtype(old)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.02)
    return model.eval()


def random_target(shape: dict[str, int], dev: torch.device, dtype: torch.dtype) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**shape, max_position_embeddings=4096, tie_word_embeddings=False, rms_norm_eps=1e-5)
    cfg._attn_implementation = "sdpa"
    return random_hf(LlamaForCausalLM, cfg, dev, dtype)


def random_fast_target(shape: dict[str, int], device: torch.device, dtype: torch.dtype) -> Any:
    """The fast decoder's own Llama (eagle.decode.fast.TargetModel) of `shape`, matrices from N(0, 0.02)
    after seed 0; rope theta 500000 as Llama 3's."""
    import torch
    from transformers import LlamaConfig

    from eagle.decode.fast import TargetModel

    config = LlamaConfig(**shape, max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=False,
                         rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    torch.manual_seed(0)
    model = TargetModel(config, device=device, dtype=dtype)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.02)
    return model.eval()


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


def save_verifier(model: Any, d: Path) -> None:
    """What the drafter reads from its target: config.json and three tensors."""
    save_verifier_files(model.config, model.model.embed_tokens.weight, model.lm_head.weight, model.model.norm.weight, d)


def save_verifier_files(config: Any, embed: Any, lm_head: Any, norm: Any, d: Path) -> None:  # noqa: ANN401 - a config, tensors
    """config.json and the three tensors a drafter reads from its target, under a checkpoint's names."""
    from safetensors.torch import save_file

    d.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(str(d))
    sd = {"model.embed_tokens.weight": embed, "lm_head.weight": lm_head, "model.norm.weight": norm}
    save_file({k: v.detach().to("cpu").contiguous() for k, v in sd.items()}, str(d / "model.safetensors"))


def bench_drafter(vdir: Path, vocab: int, dv: int, layer_ids: list[int], ttt: int,
                  dev: torch.device) -> tuple[Any, list[torch.nn.Parameter], torch.optim.Optimizer]:
    """(drafter, its trainable parameters, AdamW as eagle train's) for these benches: the draft
    vocabulary is the target's first `dv` ids, per-document attention, training mode, seed 0."""
    import torch

    from eagle.drafter import model as drafter
    from eagle.train.steps import use_doc_attention

    d2t = torch.zeros(dv, dtype=torch.long)  # draft id i = target id i
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[:dv] = True
    torch.manual_seed(0)
    model = drafter.build_drafter(vdir, layer_ids=layer_ids, d2t=d2t, t2d=t2d, ttt_steps=ttt).to(dev)
    use_doc_attention(model)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    return model, params, torch.optim.AdamW(params, lr=3e-3, betas=(0.9, 0.95), weight_decay=0.0)


# ---------------------------------------------------------------- FLOPs
def target_flops_per_token(shape: dict[str, int], seq: int) -> float:
    """Forward FLOPs per token of the decoder (no LM head): 2 x matmul params + causal attention."""
    h, i, n = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    kv = h * shape["num_key_value_heads"] // shape["num_attention_heads"]
    per_layer = 2 * (2 * h * h + 2 * h * kv + 3 * h * i)
    attn = 2 * 2 * h * (seq / 2)  # QK^T and PV over the causal prefix, on average seq/2 keys
    return n * (per_layer + attn)


def drafter_flops_per_token(h: int, inter: int, heads: int, kv_heads: int, dv: int, ttt: int, doc: int) -> float:
    """Training FLOPs per token: 6 x trained matmul params per use, plus causal attention (x3), plus
    the frozen verifier head's forward."""
    kv = h * kv_heads // heads
    layer = 2 * h * h + 2 * (2 * h) * kv + h * h + 3 * h * inter  # q,k,v take 2H inputs
    per_step = layer + h * dv  # + lm_head
    attn = 2 * 2 * h * (doc / 2)
    return 6 * 3 * h * h + ttt * (6 * per_step + 3 * attn) + 2 * h * dv


# ---------------------------------------------------------------- samples and data
def samples(shape: dict[str, int], lengths: list[int], aux: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """Raw samples of these lengths as eagle extract writes them: hidden_states [T, aux + 1, H]
    (random bf16), input_ids, loss_mask."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return [{"hidden_states": torch.randn(t, aux + 1, shape["hidden_size"], generator=g).to(torch.bfloat16),
             "input_ids": torch.randint(0, shape["vocab_size"], (t,), generator=g),
             "loss_mask": torch.ones(t, dtype=torch.long)} for t in lengths]


def row_lengths(rows: int, seq: int, seed: int = 1) -> list[int]:
    """The token counts of the real loop's variable-length rows: seq/2..seq, seeded (the same rows
    in every bench that replays this loop)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    lo = seq // 2
    return [lo + int(x) for x in torch.randint(0, seq - lo + 1, (rows,), generator=g)]


def variable_lengths(n: int, shortest: int, longest: int) -> list[int]:
    """The token counts of the variable-length rows (seeded: every bench that reads W/data-v, and
    bench/pack_shapes.py's replay of its packing, sees the same lengths)."""
    import torch

    g = torch.Generator().manual_seed(0)
    return torch.randint(shortest, longest + 1, (n,), generator=g).tolist()


def make_rows(vocab: int, lengths: list[int], where: Path, seed: int) -> Path:
    import datasets
    import torch

    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]
    ds = datasets.Dataset.from_dict({"input_ids": rows, "loss_mask": [[0] * 4 + [1] * (len(r) - 4) for r in rows],
                                     "seq_len": lengths})
    ds.set_format("torch")  # as `eagle prepare` writes it; speculators' loader compares its tensors
    ds.save_to_disk(str(where))
    return where


def make_data(vocab: int, samples: int, seq_len: int, where: Path, seed: int = 0) -> Path:
    """A prepared dataset of random-token rows (lengths seq_len/2..seq_len), loss on all but 4 tokens."""
    import datasets
    import torch

    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(seq_len // 2, seq_len + 1, (samples,), generator=g).tolist()
    rows = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lens]
    datasets.Dataset.from_dict({"input_ids": rows, "loss_mask": [[0] * 4 + [1] * (len(r) - 4) for r in rows],
                                "seq_len": lens}).save_to_disk(str(where))
    return where


def prepare(work: Path, shape: dict[str, int], n: int, seq: int, modes: list[str], gpu: bool,
            smoke: bool) -> tuple[Path, Path, Path | None, list[int], list[int]]:
    """W/target, W/data-v (n rows of seq/2..seq tokens) and W/data-f (fixed rows, only when "fixed" is
    run), extracted and with a vocabulary; what W already holds complete is reused (a marker file is
    written last). `eagle extract` on W/data-v runs alone, with its metrics in W/extract-data-v.json:
    bench/multi_gpu_scaling.py takes it as the 1-process extraction (its files' times give the rate)."""
    lengths_v = variable_lengths(n, seq // 2, seq)
    n_fixed = max(8, n // 4)
    layer_ids = [2, shape["num_hidden_layers"] // 2, shape["num_hidden_layers"] - 3]
    target, data_v, data_f = work / "target", work / "data-v", work / "data-f"
    want = {"shape": shape, "lengths_v": lengths_v, "n_fixed": n_fixed, "seq": seq, "layer_ids": layer_ids}
    marker = work / "prepared.json"
    have = json.loads(marker.read_text()) if marker.is_file() else {}
    fixed = "fixed" in modes
    if have.get("want") == want and (have.get("fixed") or not fixed):
        return target, data_v, data_f if have.get("fixed") else None, lengths_v, layer_ids
    import shutil

    for d in (target, data_v, data_f):
        shutil.rmtree(d, ignore_errors=True)
    make_target(shape, target, gpu)
    make_rows(shape["vocab_size"], lengths_v, data_v, 1)
    if fixed:
        make_rows(shape["vocab_size"], [seq] * n_fixed, data_f, 2)
    ids = ",".join(map(str, layer_ids))
    for d in (data_v, data_f) if fixed else (data_v,):  # one at a time: V's extraction is a 1-process figure
        finish(eagle_cli("extract", "--model", str(target), "--data", str(d), "--layer-ids", ids, "--keep-free", "0",
                         "--batch-tokens", str(EXTRACT_BATCH["smoke" if smoke else "gpu"]),
                         *([] if gpu else ["--device", "cpu"]), env={"RUNBOOK_METRICS": str(work / f"extract-{d.name}.json")}))
    finish(eagle_cli("vocab", "--data", str(data_v), "--draft-vocab", str(64 if smoke else 8000)))
    if fixed:
        (data_f / "vocab.safetensors").write_bytes((data_v / "vocab.safetensors").read_bytes())
    marker.write_text(json.dumps({"want": want, "fixed": fixed}) + "\n")
    return target, data_v, data_f if fixed else None, lengths_v, layer_ids


# ---------------------------------------------------------------- the drafter's training step, measured
def drafter_training(table: Table, model: Any, rows: list[list[int]], shape: dict[str, Any], dev: torch.device,
                     ceil: dict[str, float], smoke: bool, scratch: Path, layer_ids: list[int], steps: int, warmup: int,
                     draft_vocab: int | None = None) -> None:
    """The drafter's training step on hidden states captured from `model` (fixed packs of 4 rows):
    speculators' own Trainer, then eagle.train.trainer's step with speculators' packed-mask sdpa and with
    per-document attention, rows of `table` (tok/s, MFU against ceil["matmul"], step accuracies, a kernel
    profile on CUDA). gpu_throughput's section 3 and k2_slice's drafter section (`draft_vocab` 32,000).
    `model` is dropped once its samples are captured: a caller passing its last reference frees the target."""
    import logging
    import time

    import torch

    from eagle.data import capture as hc
    from eagle.drafter import model as drafter
    from eagle.train import dataset
    from eagle.train.steps import lr_lambda, step_accuracies, step_autocast

    ttt, dv_want = 3, draft_vocab or (64 if smoke else 8000)
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
    table.row("drafter training FLOPs", flops / 1e9, "GFLOP/token", note="6 x matmul params x ttt + attention + verifier head")
    losses = drafter.loss_config()
    lr = 3e-3  # eagle train's default, for both loops
    results: dict[str, float] = {}

    def build() -> Any:
        """A fresh drafter (seed 0); the first one built is described in a row."""
        torch.manual_seed(0)
        model_d = drafter.build_drafter(vdir, layer_ids=layer_ids, d2t=d2t, t2d=t2d, ttt_steps=ttt).to(dev)
        if not any(r["name"] == "drafter built" for r in table.rows):
            lc = model_d.config.transformer_layer_config
            table.row("drafter built", sum(p.numel() for p in model_d.parameters() if p.requires_grad) / 1e6,
                      "M trainable params",
                      note=f"{type(model_d).__name__}: one {lc.model_type} layer, hidden {lc.hidden_size}, intermediate "
                           f"{lc.intermediate_size}, {lc.num_attention_heads} heads of {getattr(lc, 'head_dim', None)}, "
                           f"draft vocab {dv}, target vocab {shape['vocab_size']}; "
                           f"{sum(p.numel() for p in model_d.parameters()) / 1e9:.2f}B in all")
        return model_d

    def report(name: str, tok_s: float, accs: list[list[float]], peer: str | None) -> None:
        last = accs[-10:]
        mean = [sum(a[k] for a in last) / len(last) for k in range(ttt)]
        acc = step_accuracies(mean, [1.0] * len(mean))
        mfu = tok_s * flops / ceil["matmul"]
        table.row(name, tok_s, "tok/s", limit=("matmul rate (MFU)", ceil["matmul"] / flops),
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
            table.row("speculators Trainer step (its own synchronised timer)", med["step_ms"], "ms",
                note=" ".join(f"{k[:-3]} {v:.1f}" for k, v in med.items() if k != "step_ms"))
    except Exception as e:  # noqa: BLE001
        table.failed(name, e)

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
            table.kernel_rows(lambda: train_step(model_e, batch_of(order[0]), opt, None, params, ttt, losses, autocast), dev)
        return tok_s, [a.float().tolist() for a in accs_dev]

    for label, per_doc in (("eagle train step, packed-mask sdpa (before)", False),
                           ("eagle train step, per-document attention (now)", True)):
        try:
            tok_s, accs = eagle_loop(per_doc, prof=True)
            results[label] = tok_s
            report(label, tok_s, accs, "speculators Trainer")
        except Exception as e:  # noqa: BLE001
            table.failed(label, e)

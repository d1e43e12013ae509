"""Tiny targets and offline hidden-state data for the training tests (test_train/_ddp/_drafter/_checkpoint).

Writes the documented data format directly (speculators' offline format + DATA/vocab.safetensors),
so these tests do not depend on `eagle extract` / `eagle vocab`. Imported by name (`import _train_data
as td`: tests/ is on sys.path).
"""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 128
LAYERS = 8
HIDDEN = 32
LAYER_IDS = [2, 4, 5]
DRAFT_VOCAB = 64


def make_target(out: Path, seed: int = 0, hidden: int = HIDDEN) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=LAYERS,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # sharper logits than the default init, so argmax targets are not near-ties
        model.lm_head.weight.mul_(20)
    model.save_pretrained(str(out))
    return out


def make_drafter(root: Path) -> tuple[Path, Path]:
    """(target, drafter) under root: a tiny target and an untrained drafter saved by eagle.drafter.model,
    whose draft vocabulary is the even token ids."""
    from eagle.drafter import model as drafter

    target = make_target(root / "target")
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[::2] = True
    d2t = torch.nonzero(t2d).squeeze(1) - torch.arange(DRAFT_VOCAB)
    model = drafter.build_drafter(target, layer_ids=LAYER_IDS, d2t=d2t, t2d=t2d, ttt_steps=3)
    drafter.save(model, root / "draft")
    return target, root / "draft"


def markov_sequences(n: int, length: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    nxt = torch.randint(0, VOCAB, (VOCAB, 2), generator=g)
    seqs = []
    for _ in range(n):
        t = int(torch.randint(0, VOCAB, (1,), generator=g))
        seq = [t]
        for _ in range(length - 1):
            t = int(nxt[t, int(torch.rand(1, generator=g) < 0.2)])
            seq.append(t)
        seqs.append(seq)
    return seqs


@torch.no_grad()
def make_data(target: Path, out: Path, n: int = 24, length: int = 40, seed: int = 0,
              draft_vocab: int = DRAFT_VOCAB, lengths: list[int] | None = None) -> Path:
    """hidden states of `target` on n Markov sequences, + vocab.safetensors (top draft_vocab tokens).
    `lengths` gives each sequence its own length (n of them; `length` is then unused)."""
    import datasets
    from safetensors.torch import save_file
    from transformers import LlamaForCausalLM

    from eagle.data import hidden_io

    model = LlamaForCausalLM.from_pretrained(str(target)).eval()
    captured = {}
    model.model.norm.register_forward_pre_hook(lambda m, a: captured.__setitem__("last", a[0]))
    sizes = lengths if lengths is not None else [length] * n
    seqs = [seq[:size] for seq, size in zip(markov_sequences(n, max(sizes), seed), sizes, strict=True)]
    (out / "hidden_states").mkdir(parents=True, exist_ok=True)
    masks = []
    counts = torch.zeros(VOCAB, dtype=torch.long)
    for i, seq in enumerate(seqs):
        ids = torch.tensor([seq])
        hs = model(ids, output_hidden_states=True).hidden_states
        stack = torch.stack([hs[k][0] for k in LAYER_IDS] + [captured["last"][0]], dim=1)
        hidden_io.write_sample(out, i, stack, ids[0])
        mask = [0] * 4 + [1] * (len(seq) - 4)
        masks.append(mask)
        counts += torch.bincount(ids[0], minlength=VOCAB)
    datasets.Dataset.from_dict({"input_ids": seqs, "loss_mask": masks, "seq_len": [len(s) for s in seqs]}).save_to_disk(str(out))
    hidden_io.write_data_meta(out, hidden_io.DataMeta(target=str(target), layer_ids=LAYER_IDS, hidden_size=model.config.hidden_size,
                                                      vocab_size=VOCAB, num_layers=LAYERS, num_samples=n))
    order = sorted(range(VOCAB), key=lambda t: (-int(counts[t]), t))[:draft_vocab]
    chosen = torch.tensor(sorted(order), dtype=torch.long)
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[chosen] = True
    save_file({"d2t": chosen - torch.arange(draft_vocab), "t2d": t2d}, str(out / "vocab.safetensors"))
    return out


def make_small(root: Path) -> tuple[Path, Path]:
    """A tiny target under `root` and its hidden states on 16 sequences of 32 tokens (test_train,
    test_train_options)."""
    target = make_target(root / "target")
    return target, make_data(target, root / "data", n=16, length=32)


def train_args(target: Path, data: Path, out: Path, **kw: object):
    """TrainConfig of a tiny run on the CPU holding out 20% for validation; `kw` sets the rest."""
    from eagle.train.config import TrainConfig

    return TrainConfig(**{"model": str(target), "data": str(data), "out": str(out), "val_fraction": 0.2,
                        "device": "cpu", **kw})


def kill_at_step_state(cmd: list[str], state: Path, env: dict[str, str], cwd: Path | None = None,
                       timeout: float = 300) -> int:
    """Start `eagle train ... --save-every-steps N` (`cmd`), SIGKILL it (the process started here, by its
    own handle) as soon as its step state `state` exists, and return its exit status. Fails when no
    step state appeared before it ended or within `timeout` seconds."""
    import signal
    import subprocess
    import time

    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout
        while not state.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        assert state.exists(), "no step state was written"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill() if proc.poll() is None else None
        proc.wait()
    return proc.returncode

"""Per-document attention (eagle/doc_attention.py) gives the packed-mask SDPA's losses and gradients."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

_spec = importlib.util.spec_from_file_location("_train_data", Path(__file__).with_name("_train_data.py"))
td = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(td)


def test_layout_marks_each_document() -> None:
    from eagle.doc_attention import layout, valid_mask

    index, valid = layout([3, 1, 2])
    assert index.tolist() == [[0, 1, 2], [3, 3, 3], [4, 5, 5]]
    assert valid.tolist() == [0, 1, 2, 3, 6, 7]
    assert valid_mask(valid, 3, 3).tolist() == [[True, True, True], [True, False, False], [True, True, False]]
    # rounded up to a multiple of 4: one more padding column, the same documents
    index, valid = layout([3, 1, 2], multiple=4)
    assert index.tolist() == [[0, 1, 2, 2], [3, 3, 3, 3], [4, 5, 5, 5]]
    assert valid.tolist() == [0, 1, 2, 4, 8, 9]
    assert layout([5, 8], multiple=8)[0].shape == (2, 8) and layout([9], multiple=8)[0].shape == (1, 16)


def test_same_loss_and_gradients_as_the_packed_mask(tmp_path: Path) -> None:
    from eagle import dataset, drafter, train

    target = td.make_target(tmp_path / "target")
    torch.manual_seed(0)
    h = 32
    g = torch.Generator().manual_seed(1)
    raws = [{"hidden_states": torch.randn(n, 4, h, generator=g), "input_ids": torch.randint(0, 64, (n,), generator=g),
             "loss_mask": torch.ones(n, dtype=torch.long)} for n in (17, 9, 30)]
    samples = [dataset.shift_sample(r, 64) for r in raws]
    cfg = __import__("json").loads((target / "config.json").read_text())
    assert cfg["hidden_size"] == h
    d2t = torch.zeros(cfg["vocab_size"] // 2, dtype=torch.long)
    t2d = torch.zeros(cfg["vocab_size"], dtype=torch.bool)
    t2d[: d2t.shape[0]] = True
    losses = drafter.loss_config()
    results = []
    for per_doc, multiple in ((False, 1), (True, 1), (True, 16)):  # 16: Lmax 29 -> 32 columns
        torch.manual_seed(0)
        model = drafter.build_drafter(target, layer_ids=[1, 2, 3], d2t=d2t, t2d=t2d, ttt_steps=3)
        if per_doc:
            train.use_doc_attention(model)
        batch = dataset.collate(samples, layout=per_doc, layout_multiple=multiple)
        loss, metrics = train.forward(model, batch, 3, losses)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((loss.detach(), {k: v.detach() for k, v in metrics.items()}, grads))
    (l0, m0, g0) = results[0]
    for l1, m1, g1 in results[1:]:
        assert torch.allclose(l0, l1, rtol=1e-5, atol=1e-6), (l0, l1)
        assert all(torch.allclose(m0[k].float(), m1[k].float(), rtol=1e-5, atol=1e-6) for k in m0)
        assert g0.keys() == g1.keys() and g0
        for k in g0:
            assert torch.allclose(g0[k], g1[k], rtol=1e-4, atol=1e-6), k

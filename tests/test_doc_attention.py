"""Per-document attention (eagle/doc_attention.py) gives the packed-mask SDPA's losses and gradients."""

from __future__ import annotations

from pathlib import Path

import _train_data as td
import torch


def test_layout_marks_each_document() -> None:
    from eagle.doc_attention import layout

    lay = layout([3, 1, 2])
    assert lay["doc_index"].tolist() == [[0, 1, 2], [3, 3, 3], [4, 5, 5]]
    assert lay["doc_pos"].tolist() == [0, 1, 2, 3, 6, 7]
    assert lay["doc_mask"].tolist() == [[True, True, True], [True, False, False], [True, True, False]]
    # rounded up to a multiple of 4: one more padding column, the same documents
    lay = layout([3, 1, 2], multiple=4)
    assert lay["doc_index"].tolist() == [[0, 1, 2, 2], [3, 3, 3, 3], [4, 5, 5, 5]]
    assert lay["doc_pos"].tolist() == [0, 1, 2, 4, 8, 9]
    assert layout([5, 8], multiple=8)["doc_index"].shape == (2, 8)
    assert layout([9], multiple=8)["doc_index"].shape == (1, 16)
    # a pack padded to 9 tokens: the 3 padding tokens read cell 0
    assert layout([3, 1, 2], total=9)["doc_pos"].tolist() == [0, 1, 2, 3, 6, 7, 0, 0, 0]


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


def _random_samples(lengths: list[int], h: int = 32, seed: int = 1) -> list[dict[str, torch.Tensor]]:
    from eagle import dataset

    g = torch.Generator().manual_seed(seed)
    raws = [{"hidden_states": torch.randn(n, 4, h, generator=g), "input_ids": torch.randint(0, 128, (n,), generator=g),
             "loss_mask": (torch.rand(n, generator=g) < 0.8).long()} for n in lengths]
    return [dataset.shift_sample(r, 256) for r in raws]


def test_bucketed_step_equals_the_unbucketed_one(tmp_path: Path) -> None:
    """Shape buckets (the pack padded to --batch-tokens, widths rounded up to a multiple) change
    only the shapes: the same batch gives the same loss (1e-5), metrics and gradients, and after one
    optimizer step the same loss again."""
    from eagle import dataset, drafter, train

    target = td.make_target(tmp_path / "target")
    t2d = torch.zeros(td.VOCAB, dtype=torch.bool)
    t2d[::2] = True
    d2t = torch.nonzero(t2d).squeeze(1) - torch.arange(td.VOCAB // 2)
    samples = _random_samples([23, 9, 41, 17])  # 86 tokens after the shift
    losses = drafter.loss_config()
    no_autocast = torch.autocast("cpu", enabled=False)
    results = []
    for pad_to, multiple in ((None, 1), (128, 16), (100, 64)):
        torch.manual_seed(0)
        model = drafter.build_drafter(target, layer_ids=[1, 2, 3], d2t=d2t, t2d=t2d, ttt_steps=4)
        train.use_doc_attention(model)
        params = [p for p in model.parameters() if p.requires_grad]
        batch = dataset.collate(samples, layout=True, layout_multiple=multiple, pad_to=pad_to)
        assert batch["input_ids"].shape[1] == (pad_to or 86)
        loss, metrics = train.backward_step(model, batch, 4, losses, no_autocast, loss_decay=0.8)
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        train.optimizer_step(torch.optim.SGD(params, lr=0.5), None, params)
        with torch.no_grad():
            after, _ = train.forward(model, batch, 4, losses, 0.8)
        results.append((float(loss), metrics, grads, float(after)))
    loss0, m0, g0, after0 = results[0]
    assert after0 < loss0  # the step did something
    for loss1, m1, g1, after1 in results[1:]:
        assert abs(loss0 - loss1) <= 1e-5 and abs(after0 - after1) <= 1e-5, (loss0, loss1, after0, after1)
        for k in m0:
            assert torch.allclose(m0[k].float(), m1[k].float(), rtol=1e-5, atol=1e-6), k
        assert g0.keys() == g1.keys() and g0
        for n in g0:
            assert torch.allclose(g0[n], g1[n], rtol=1e-4, atol=1e-6), n


def test_a_pack_that_overflows_its_bucket_is_refused() -> None:
    import pytest

    from eagle import dataset
    from eagle.common import EagleError

    with pytest.raises(EagleError, match="does not fit"):
        dataset.collate(_random_samples([30, 30]), layout=True, pad_to=50)

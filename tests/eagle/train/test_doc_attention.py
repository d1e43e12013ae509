"""Per-document attention (eagle/train/doc_attention.py) gives the packed-mask SDPA's losses and gradients."""

from __future__ import annotations

from pathlib import Path

import _train_data as td
import pytest
import torch


def test_layout_marks_each_document() -> None:
    from eagle.train.doc_attention import layout

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
    from eagle.drafter import model as drafter
    from eagle.train import dataset
    from eagle.train import steps as train

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
    from eagle.train import dataset

    g = torch.Generator().manual_seed(seed)
    raws = [{"hidden_states": torch.randn(n, 4, h, generator=g), "input_ids": torch.randint(0, 128, (n,), generator=g),
             "loss_mask": (torch.rand(n, generator=g) < 0.8).long()} for n in lengths]
    return [dataset.shift_sample(r, 256) for r in raws]


def test_bucketed_step_equals_the_unbucketed_one(tmp_path: Path) -> None:
    """Shape buckets (the pack padded to --batch-tokens, widths rounded up to a multiple) change
    only the shapes: the same batch gives the same loss (1e-5), metrics and gradients, and after one
    optimizer step the same loss again."""
    from eagle.drafter import model as drafter
    from eagle.train import dataset
    from eagle.train import steps as train

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
    from eagle.common import EagleError
    from eagle.train import dataset

    with pytest.raises(EagleError, match="does not fit"):
        dataset.collate(_random_samples([30, 30]), layout=True, pad_to=50)


class _Attn(torch.nn.Module):
    """What doc_sdpa reads off transformers' attention module: GQA groups and causality."""

    num_key_value_groups = 2
    is_causal = True


def _attention_by_definition(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             lay: dict[str, torch.Tensor], scale: float) -> torch.Tensor:
    """[T, H, D] in float64, position by position: draft step j's query at a document's offset o
    attends the document's positions <= o in block 0 and its own position in blocks 1..j."""
    t, blocks = query.shape[2], key.shape[2] // query.shape[2]
    q, k, v = query[0].double().cpu(), key[0].double().cpu(), value[0].double().cpu()
    g = q.shape[0] // k.shape[0]
    out = torch.zeros(t, q.shape[0], q.shape[2], dtype=torch.float64)
    for row, mask in zip(lay["doc_index"].tolist(), lay["doc_mask"].tolist(), strict=True):
        for o in range(sum(mask)):
            cols = row[: o + 1] + [row[o] + t * j for j in range(1, blocks)]
            for h in range(q.shape[0]):
                w = torch.softmax(k[h // g, cols] @ q[h, row[o]] * scale, 0)
                out[row[o], h] = w @ v[h // g, cols]
    return out


def worst_error_against_the_definition(device: str, dtype: torch.dtype, amplitude: float, blocks: int,
                                       seed: int = 0, total: int = 17,
                                       varlen: bool | None = None) -> tuple[float, float]:
    """(largest |doc_sdpa - definition|, largest |definition|) on the real tokens of 3 documents of
    5/9/3 tokens (widths rounded to 8) in a pack of `total` (17: no padding), 4 query heads on 2 kv
    heads, head size 16; `amplitude` scales q and k (large scores test the diagonal score's
    precision); `varlen` picks doc_sdpa's form (None: its own choice)."""
    from eagle.train import doc_attention

    g = torch.Generator().manual_seed(seed)
    lay = doc_attention.layout([5, 9, 3], multiple=8, total=total)
    q = (torch.randn(1, 4, total, 16, generator=g) * amplitude).to(device, dtype)
    k = (torch.randn(1, 2, blocks * total, 16, generator=g) * amplitude).to(device, dtype)
    v = torch.randn(1, 2, blocks * total, 16, generator=g).to(device, dtype)
    with doc_attention.forced(varlen):
        out, _ = doc_attention.doc_sdpa(_Attn(), q, k, v, None, **{n: x.to(device) for n, x in lay.items()},
                                        scaling=0.25)
    ref = _attention_by_definition(q, k, v, lay, 0.25)
    real = lay["doc_index"][lay["doc_mask"]]
    return float((out[0, real].double().cpu() - ref[real]).abs().max()), float(ref[real].abs().max())


def bf16_ulp(x: float) -> float:
    """The spacing of bfloat16 numbers at magnitude x (8 significant bits)."""
    import math

    return 2.0 ** (math.floor(math.log2(x)) - 7)


def test_doc_sdpa_equals_the_attention_by_definition() -> None:
    """The anchor form (one causal SDPA; the draft blocks' diagonal as anchor keys) is the masked
    attention: float32 to 1e-5 for 0, 1 and 2 earlier draft steps; bfloat16 within 1.5 ulps of the
    output's magnitude, with scores large enough (amplitude 6) that carrying the diagonal score in
    one bfloat16 number instead of a high and a low part would miss that (3.9e-2 against 1.3e-2
    with both parts, measured when written)."""
    for blocks in (1, 2, 3):
        err, _ = worst_error_against_the_definition("cpu", torch.float32, 1.0, blocks)
        assert err < 1e-5, (blocks, err)
        for seed in range(3):
            for amplitude in (1.0, 6.0):
                err, size = worst_error_against_the_definition("cpu", torch.bfloat16, amplitude, blocks, seed)
                assert err <= 1.5 * bf16_ulp(size), (blocks, seed, amplitude, err, size)


def _varlen_by_sequence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
                        max_q: int, max_k: int, scale: float | None = None,
                        window_size: tuple[int, int] = (-1, -1)) -> torch.Tensor:
    """torch's varlen_attn (CUDA only) restated on the CPU: a causal SDPA per sequence of `cu_q`."""
    assert window_size == (-1, 0) and torch.equal(cu_q, cu_k)
    out = []
    for a, b in zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), strict=True):
        assert b - a <= max_q
        rows = [x[a:b].transpose(0, 1) for x in (q, k, v)]
        out.append(torch.nn.functional.scaled_dot_product_attention(*rows, is_causal=True, scale=scale,
                                                                    enable_gqa=True).transpose(0, 1))
    return torch.cat(out)


def test_varlen_form_gathers_each_document_with_its_anchors(monkeypatch: pytest.MonkeyPatch) -> None:
    """doc_varlen's own part (the documents' sequences, their anchor rows, the padding joining the
    last document, the rows read back) on the CPU, its flash kernel restated as an SDPA per sequence
    (the kernel itself runs in tests/gpu/test_gpu.py): outputs equal the attention by definition on every
    real token, and with the loss's gradient on real tokens only (padding carries none) the
    gradients of q, k and v equal the grid form's, for 0-2 earlier draft blocks and packs with and
    without padding."""
    from eagle.train import doc_attention

    monkeypatch.setattr(doc_attention, "_varlen_attn", _varlen_by_sequence)
    monkeypatch.setattr(doc_attention, "_VARLEN_PARAMS", frozenset({"scale", "window_size"}))
    g = torch.Generator().manual_seed(0)
    for lengths, total in (([5, 9, 3], 17), ([5, 9, 3], 22), ([7], 10), ([4, 4], 8)):
        lay = doc_attention.layout(lengths, multiple=8, total=total)
        real = lay["doc_index"][lay["doc_mask"]]
        for blocks in (1, 2, 3):
            q = torch.randn(1, 4, total, 16, generator=g)
            k = torch.randn(1, 2, blocks * total, 16, generator=g)
            v = torch.randn(1, 2, blocks * total, 16, generator=g)
            grad = torch.zeros(1, total, 4, 16)
            grad[0, real] = torch.randn(len(real), 4, 16, generator=g)
            grads = {}
            for varlen in (True, False):
                leaves = [x.clone().requires_grad_() for x in (q, k, v)]
                with doc_attention.forced(varlen):
                    out, _ = doc_attention.doc_sdpa(_Attn(), *leaves, None, **lay, scaling=0.25)
                out.backward(grad)
                grads[varlen] = [x.grad for x in leaves]
                if varlen:
                    ref = _attention_by_definition(q, k, v, lay, 0.25)
                    assert float((out[0, real].double() - ref[real]).abs().max()) < 1e-5, (lengths, total, blocks)
            for mine, grid in zip(grads[True], grads[False], strict=True):
                assert torch.allclose(mine, grid, atol=1e-5), (lengths, total, blocks, float((mine - grid).abs().max()))

"""eagle/hidden_capture.py: the fast capture path gives exactly the plain forward's hidden states."""

from __future__ import annotations

import random

import pytest
import torch
from safetensors.torch import load_file

from eagle import hidden_capture as hc
from eagle import hidden_io
from eagle.common import EagleError


def tiny_llama(layers: int = 6, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg).eval()


def reference(model, ids: list[int], layer_ids: list[int]) -> torch.Tensor:
    """[T, L+1, H] from a plain single-sample forward: output_hidden_states[k], then the pre-norm last layer."""
    store = {}
    h = model.model.norm.register_forward_pre_hook(lambda m, a: store.__setitem__("last", a[0]))
    try:
        with torch.no_grad():
            out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    finally:
        h.remove()
    return torch.stack([out.hidden_states[k][0] for k in layer_ids] + [store["last"][0]], dim=1)


def test_plan_buckets_covers_todo_within_budget():
    rng = random.Random(1)
    lengths = [rng.randint(1, 90) for _ in range(60)]
    todo = [i for i in range(60) if i % 5]
    batches = hc.plan_buckets(lengths, todo, 256, pad_multiple=16)
    assert sorted(i for b in batches for i in b) == todo
    for b in batches:
        width = hc.round_up(max(lengths[i] for i in b), 16)
        assert len(b) == 1 or width * len(b) <= 256
    assert hc.plan_buckets([500, 3], [0, 1], 100) == [[1], [0]]  # too long: runs alone
    with pytest.raises(EagleError):
        hc.plan_buckets([3], [0], 0)


def test_padded_input_right_pads_to_multiple():
    x = hc.padded_input([[5, 6, 7], [8]], [0, 1], pad_multiple=4, pad_id=0)
    assert x.tolist() == [[5, 6, 7, 0], [8, 0, 0, 0]]


def test_capture_equals_plain_forward_with_padding():
    """Right-padded batches with no attention mask give each sample exactly its own states."""
    model = tiny_llama()
    layer_ids = [1, 3, 4]
    rng = random.Random(0)
    rows = [[rng.randrange(97) for _ in range(rng.randint(3, 40))] for _ in range(9)]
    cap = hc.HiddenCapture(model, layer_ids)
    try:
        for batch in hc.plan_buckets([len(r) for r in rows], range(len(rows)), 96, pad_multiple=8):
            hs = cap.run(hc.padded_input(rows, batch, 8))
            assert hs.shape[:3] == (len(batch), hc.round_up(max(len(rows[i]) for i in batch), 8), 4)
            for r, i in enumerate(batch):
                ref = reference(model, rows[i], layer_ids)
                got = hs[r, : len(rows[i])]
                assert got.shape == ref.shape
                torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    finally:
        cap.close()
    assert not model.model.layers[1]._forward_pre_hooks  # hooks removed


def test_capture_rejects_bad_layer_ids():
    model = tiny_llama(layers=4)
    for ids in ([4], [2, 1], [1, 1], []):
        with pytest.raises(EagleError, match="layer ids"):
            hc.HiddenCapture(model, ids)


def test_write_safetensors_is_readable_and_exact(tmp_path):
    t = {"hidden_states": torch.randn(5, 3, 8).to(torch.bfloat16), "token_ids": torch.arange(5)}
    path = tmp_path / "x.safetensors"
    n = hc.write_safetensors(path, t)
    assert n == path.stat().st_size
    back = load_file(str(path))
    assert torch.equal(back["hidden_states"], t["hidden_states"]) and torch.equal(back["token_ids"], t["token_ids"])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]


def test_extract_rows_writes_valid_files(tmp_path):
    """The whole engine on CPU: every row gets a file that hidden_io validates, equal to the reference."""
    model = tiny_llama()
    layer_ids = [1, 3, 4]
    rng = random.Random(2)
    rows = [[rng.randrange(97) for _ in range(rng.randint(2, 30))] for _ in range(7)]
    todo = [0, 2, 3, 5, 6]
    stats = hc.extract_rows(model, rows, todo, layer_ids, tmp_path, batch_tokens=64, pad_multiple=4)
    assert stats.samples == len(todo) and stats.tokens == sum(len(rows[i]) for i in todo)
    assert stats.bytes_written == sum(hidden_io.hs_path(tmp_path, i).stat().st_size for i in todo)
    assert not hidden_io.hs_path(tmp_path, 1).exists()
    for i in todo:
        path = hidden_io.hs_path(tmp_path, i)
        assert hidden_io.validate_file(path, rows[i], len(layer_ids) + 1, 32) == []
        got = load_file(str(path))["hidden_states"]
        torch.testing.assert_close(got, reference(model, rows[i], layer_ids).to(torch.bfloat16))


def test_nan_rows_are_reported_not_written(tmp_path):
    model = tiny_llama(layers=4)
    with torch.no_grad():
        model.model.layers[2].mlp.down_proj.weight.fill_(float("nan"))
    rows = [[1, 2, 3], [4, 5]]
    stats = hc.extract_rows(model, rows, [0, 1], [1, 2], tmp_path)
    assert sorted(stats.bad_rows) == [0, 1]
    assert not any(hidden_io.hs_path(tmp_path, i).exists() for i in (0, 1))


def test_plan_buckets_keeps_padding_waste_small():
    rng = random.Random(0)
    lengths = [rng.randint(5, 60) for _ in range(50)]
    todo = [i for i in range(50) if i % 7]
    batches = hc.plan_buckets(lengths, todo, 128)
    assert sorted(i for b in batches for i in b) == todo
    waste = sum(max(lengths[i] for i in b) * len(b) - sum(lengths[i] for i in b) for b in batches)
    assert waste < 0.1 * sum(lengths[i] for i in todo)  # sorted by length: little padding

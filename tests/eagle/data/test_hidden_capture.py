"""eagle/data/capture.py: the fast capture path gives exactly the plain forward's hidden states."""

from __future__ import annotations

import random

import pytest
import torch
from safetensors.torch import load_file

from eagle.common import EagleError
from eagle.data import capture as hc
from eagle.data import hidden_io


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


def test_causal_sdpa_builds_no_mask_under_compile_and_keeps_the_states():
    """use_causal_sdpa: under torch.compile transformers' sdpa path builds a [B, 1, T, T] mask (it
    cannot skip it while tracing before torch 2.14); the switched target builds none, so SDPA takes
    its causal kernel; the padded rows' states stay exact."""
    from transformers.masking_utils import create_causal_mask

    model = tiny_llama(layers=4)
    emb, pos = torch.zeros(2, 8, 32), torch.arange(8).expand(2, 8)

    def mask(e: torch.Tensor, p: torch.Tensor):
        return create_causal_mask(model.config, e, None, None, position_ids=p)

    torch._dynamo.reset()
    built = torch.compile(mask)(emb, pos)
    assert built is not None and tuple(built.shape) == (2, 1, 8, 8)  # what a compiled sdpa decoder does
    rows = [[5, 9, 14, 2, 7, 30, 11], [3, 8, 1]]
    cap = hc.HiddenCapture(model, [1, 2])
    try:
        assert hc.use_causal_sdpa(model.config) == "sdpa"
        assert model.config._attn_implementation == hc.CAUSAL_SDPA
        torch._dynamo.reset()
        assert torch.compile(mask)(emb, pos) is None
        hs = cap.run(hc.padded_input(rows, [0, 1], 8))
    finally:
        model.config._attn_implementation = "sdpa"
        cap.close()
    for r, ids in enumerate(rows):
        torch.testing.assert_close(hs[r, : len(ids)], reference(model, ids, [1, 2]), rtol=1e-5, atol=1e-5)


def test_causal_sdpa_is_declined_where_a_mask_says_more():
    from transformers import MistralConfig, Qwen3Config

    windowed = MistralConfig(sliding_window=16)
    windowed._attn_implementation = "sdpa"
    assert not hc.plain_causal(windowed) and hc.use_causal_sdpa(windowed) is None
    assert windowed._attn_implementation == "sdpa"
    mixed = Qwen3Config(use_sliding_window=True, sliding_window=16, max_window_layers=1, num_hidden_layers=2)
    assert "sliding_attention" in mixed.layer_types and not hc.plain_causal(mixed)
    plain = Qwen3Config(num_hidden_layers=2)
    assert hc.plain_causal(plain)
    eager = Qwen3Config(num_hidden_layers=2)
    eager._attn_implementation = "eager"
    assert hc.use_causal_sdpa(eager) is None  # only an sdpa target is switched
    with pytest.raises(EagleError, match="compile scope"):
        hc.HiddenCapture(tiny_llama(layers=2), [0], scope="model")


def test_whole_decoder_compile_equals_the_eager_capture():
    """scope="decoder": the whole capture as one compiled graph (hooks traced, no mask) gives the
    eager capture's states, over two widths; uncompile restores the attention implementation."""
    model = tiny_llama(layers=2)
    rows = [[5, 9, 14, 2, 7, 30, 11], [3, 8, 1], [4] * 16]
    eager = hc.HiddenCapture(model, [0, 1])
    want = [eager.run(hc.padded_input(rows, b, 8)) for b in ([0, 1], [2])]
    eager.close()
    torch._dynamo.reset()
    cap = hc.HiddenCapture(model, [0, 1], compile=True, scope="decoder")
    try:
        assert model.config._attn_implementation == hc.CAUSAL_SDPA
        got = [cap.run(hc.padded_input(rows, b, 8)) for b in ([0, 1], [2])]
    finally:
        cap.close()  # without uncompile: closing alone gives the target its attention back
    assert model.config._attn_implementation == "sdpa"
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rope_in_graph", [False, True])
def test_whole_decoder_compile_makes_the_rope_tables_outside_the_graph(rope_in_graph):
    """compile_decoder runs the decoder's rotary embedding outside the compiled graph (one graph break
    there: its tables become the graph's inputs; inside the graph Inductor recomputes them in every
    layer), unless rope_in_graph (one graph, no break); the states are the eager capture's either
    way, and closing gives the module its own forward back."""
    from torch._dynamo.utils import counters

    model = tiny_llama(layers=2)
    rope = model.model.rotary_emb
    x = hc.padded_input([[5, 9, 14, 2, 7, 30, 11], [3, 8, 1]], [0, 1], 8)
    eager = hc.HiddenCapture(model, [0, 1])
    want = eager.run(x)
    eager.close()
    torch._dynamo.reset()
    counters.clear()
    cap = hc.HiddenCapture(model, [0, 1])
    cap.compile_decoder(rope_in_graph=rope_in_graph)
    try:
        assert ("forward" in vars(rope)) is not rope_in_graph
        got = cap.run(x)
        again = cap.run(x)
    finally:
        cap.close()
    assert "forward" not in vars(rope)
    breaks = list(counters["graph_break"])
    if rope_in_graph:
        assert breaks == [] and counters["stats"]["unique_graphs"] == 1
    else:
        assert breaks and all(type(rope).__name__ + ".forward" in b for b in breaks), breaks
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(again, got)

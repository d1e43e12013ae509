"""The speculators drafter: reload to identical outputs, and the forward semantics docs/eagle.md states
(a pure-torch re-implementation from the checkpoint tensors must give speculators' logits)."""

from __future__ import annotations

from pathlib import Path

import _train_data as td
import pytest
import torch
import torch.nn.functional as F

from eagle.drafter import checkpoint

TTT = 3


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory):
    from eagle.drafter import model as drafter
    from eagle.train import dataset

    root = tmp_path_factory.mktemp("drafter")
    target = td.make_target(root / "target")
    data = td.make_data(target, root / "data", n=3, length=24)
    d2t, t2d = dataset.read_vocab(data)
    torch.manual_seed(1)
    model = drafter.build_drafter(target, layer_ids=td.LAYER_IDS, d2t=d2t, t2d=t2d, ttt_steps=TTT)
    with torch.no_grad():  # move every trained weight off its init so the comparison means something
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    drafter.save(model, root / "draft", keep_float32=True, keep_embedding=True)  # exact reload: float32
    hs = dataset.HiddenStates(data, budget=64)
    batch = hs.batch([0, 1], torch.device("cpu"))
    return root, target, model, batch


def _outputs(model, batch):
    from eagle.drafter import model as drafter

    loss, metrics = drafter.train_forward(model, batch, TTT, drafter.loss_config())
    return loss, drafter.draft_tokens(model, batch, TTT)


def test_reload_gives_identical_outputs(setup) -> None:
    from eagle.drafter import model as drafter

    root, target, model, batch = setup
    loaded = drafter.load_drafter(root / "draft", target_dir=target)
    assert loaded._attn_impl == "sdpa"
    with torch.no_grad():
        l0, t0 = _outputs(model.eval(), batch)
        l1, t1 = _outputs(loaded.eval(), batch)
    assert torch.equal(l0, l1)
    assert all(torch.equal(a, b) for a, b in zip(t0, t1, strict=True))
    for name, p in model.state_dict().items():
        assert torch.equal(p, loaded.state_dict()[name]), name


def test_checkpoint_without_embeddings_takes_the_targets(setup, tmp_path: Path) -> None:
    from eagle.drafter import model as drafter

    root, target, model, batch = setup
    state = checkpoint.load_draft_state(root / "draft")
    del state["embed_tokens.weight"]
    checkpoint.write_checkpoint(tmp_path, checkpoint.read_config_json(root / "draft"), state)
    loaded = drafter.load_drafter(tmp_path, target_dir=target)
    assert torch.equal(loaded.embed_tokens.weight, model.embed_tokens.weight)
    with torch.no_grad():
        assert torch.equal(_outputs(model.eval(), batch)[0], _outputs(loaded.eval(), batch)[0])


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = pos.float()[:, None] * inv[None]
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def reference_logits(state: dict, cfg: checkpoint.DraftConfig, aux: torch.Tensor, ids: torch.Tensor,
                     pos: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """docs/eagle.md "Drafter forward", for one document, teacher-forced as in training."""
    p, eps, hd = "layers.0.", cfg.rms_norm_eps, cfg.head_dim
    nh, nkv, t = cfg.num_attention_heads, cfg.num_key_value_heads, ids.shape[0]
    g = aux @ state["fc.weight"].T
    keys, values, out = [], [], []
    cur = ids
    for s in range(steps):
        e = _rms(state["embed_tokens.weight"][cur], state[p + "input_layernorm.weight"], eps)
        h = _rms(g, state[p + "hidden_norm.weight"], eps)
        residual = h if cfg.norm_before_residual else g
        x = torch.cat([e, h], -1)
        q = (x @ state[p + "self_attn.q_proj.weight"].T).view(t, nh, hd).transpose(0, 1)
        k = (x @ state[p + "self_attn.k_proj.weight"].T).view(t, nkv, hd).transpose(0, 1)
        v = (x @ state[p + "self_attn.v_proj.weight"].T).view(t, nkv, hd).transpose(0, 1)
        q, k = _rope(q, pos + s, cfg.rope_theta), _rope(k, pos + s, cfg.rope_theta)
        keys.append(k.repeat_interleave(nh // nkv, 0))
        values.append(v.repeat_interleave(nh // nkv, 0))
        # query i sees step-0 keys j <= i, and its own position's keys from steps 1..s
        mask = torch.cat([torch.ones(t, t).tril().bool()] + [torch.eye(t).bool()] * s, dim=1)
        att = (q @ torch.cat(keys, 1).transpose(1, 2)) / hd**0.5
        att = att.masked_fill(~mask, float("-inf")).softmax(-1) @ torch.cat(values, 1)
        h = residual + att.transpose(0, 1).reshape(t, nh * hd) @ state[p + "self_attn.o_proj.weight"].T
        m = _rms(h, state[p + "post_attention_layernorm.weight"], eps)
        h = h + (F.silu(m @ state[p + "mlp.gate_proj.weight"].T) * (m @ state[p + "mlp.up_proj.weight"].T)) @ state[p + "mlp.down_proj.weight"].T
        out.append(_rms(h, state["norm.weight"], eps) @ state["lm_head.weight"].T)
        g = h  # the next step's hidden input: this step's output BEFORE the final norm
        cur = torch.cat([ids[s + 1:], ids.new_zeros(s + 1)])  # training feeds the true next tokens
    return out


def test_documented_forward_matches_speculators(setup) -> None:
    root, _, model, batch = setup
    state = checkpoint.load_draft_state(root / "draft")
    cfg = checkpoint.read_draft_config(root / "draft")
    one = batch["document_ids"][0] == 0
    doc = {k: v[:, one] for k, v in batch.items()}
    captured: list[torch.Tensor] = []
    hook = model.lm_head.register_forward_hook(lambda m, a, o: captured.append(o[0].detach()))
    try:
        with torch.no_grad():
            model.eval()(hidden_states=doc["hidden_states"], input_ids=doc["input_ids"],
                         document_ids=doc["document_ids"], position_ids=doc["position_ids"], ttt_steps=TTT)
    finally:
        hook.remove()
    ref = reference_logits(state, cfg, doc["hidden_states"][0], doc["input_ids"][0], doc["position_ids"][0], TTT)
    for s in range(TTT):
        # positions whose teacher-forced input exists (the last s have padding inputs)
        n = ref[s].shape[0] - s
        torch.testing.assert_close(ref[s][:n], captured[s][:n], rtol=1e-4, atol=1e-4)

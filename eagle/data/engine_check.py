"""`eagle check-engines`: do transformers and vLLM compute the same hidden states on the same token ids?

The drafter is trained on states from one engine and served beside another: states that differ
beyond rounding mean a drafter that scores well offline and poorly in production (the MLA toy's 0.15-
0.24 relative difference, docs/eagle.md). The check sends the prompts' token ids through both:

- vLLM: the extraction server of `eagle extract --backend vllm` (serving.extraction.extract_vllm) at
  `dtype`;
- transformers: the capture of `eagle extract --backend hf` (data.capture.HiddenCapture) at `dtype`,
  and once more at float32 and at bfloat16 for the yardstick: bf16 rounding alone, the relative
  difference between transformers' own float32 and bfloat16 states.

Per aux layer (the decoder-layer inputs a drafter reads) and for the last layer (pre-norm), over all
tokens: the mean relative difference ||h_vllm - h_hf|| / ||h_hf||, the mean cosine, the yardstick, and
the verdict: `bf16-level` when the engines differ by at most `tolerance` x the yardstick, else
`differs`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from eagle.common import EagleError

BF16_LEVEL, DIFFERS = "bf16-level", "differs"


class LayerAgreement(BaseModel):
    layer: str  # the aux layer id ("2") or "last" (the pre-norm last layer)
    rel_diff: float  # mean over tokens of ||vllm - hf|| / ||hf||, both at the check's dtype
    cos_sim: float  # mean over tokens of the cosine of vllm and hf
    bf16_rel_diff: float  # the yardstick: mean ||hf_bf16 - hf_fp32|| / ||hf_fp32||
    ratio: float  # rel_diff / bf16_rel_diff
    verdict: str  # BF16_LEVEL or DIFFERS


class EngineCheck(BaseModel):
    model: str
    dtype: str
    samples: int
    tokens: int
    layer_ids: list[int]
    tolerance: float
    layers: list[LayerAgreement]
    agree: bool  # every layer's verdict is BF16_LEVEL
    vllm_seconds: float
    vllm_flags: list[str]  # the engine flags vLLM ran with (the CPU rope workaround shows here)

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for s in self.layers:
            key = "last" if s.layer == "last" else f"l{s.layer}"
            out[f"engine_rel_diff_{key}"] = s.rel_diff
            out[f"engine_cos_sim_{key}"] = s.cos_sim
            out[f"engine_bf16_rel_diff_{key}"] = s.bf16_rel_diff
        out["engine_max_ratio"] = max(s.ratio for s in self.layers)
        out["engine_max_rel_diff"] = max(s.rel_diff for s in self.layers)
        out["engines_agree"] = int(self.agree)
        return out


class Sums:
    """Running token-weighted sums of (relative difference, cosine) per column of [T, L+1, H] states."""

    def __init__(self, columns: int) -> None:
        self.rel = [0.0] * columns
        self.cos = [0.0] * columns
        self.tokens = 0

    def add(self, got: Any, ref: Any) -> None:
        import torch

        a, b = got.double(), ref.double()
        if a.shape != b.shape:
            raise EagleError(f"hidden states of shape {list(a.shape)} against {list(b.shape)}")
        rel = (a - b).norm(dim=-1) / b.norm(dim=-1).clamp_min(1e-30)
        cos = torch.nn.functional.cosine_similarity(a, b, dim=-1)
        for j in range(a.shape[1]):
            self.rel[j] += float(rel[:, j].sum())
            self.cos[j] += float(cos[:, j].sum())
        self.tokens += a.shape[0]

    def means(self) -> tuple[list[float], list[float]]:
        n = max(1, self.tokens)
        return [r / n for r in self.rel], [c / n for c in self.cos]


def hf_states(model_dir: str | Path, rows: Sequence[Sequence[int]], layer_ids: Sequence[int], dtype: Any,
              trust_remote_code: bool = False) -> list[Any]:
    """transformers' [T, L+1, H] states of each row (aux layers, then the pre-norm last), on the CPU, at `dtype`."""
    import torch

    from eagle.data.capture import HiddenCapture
    from eagle.target import open_target

    model = open_target(model_dir, trust_remote_code).load_model("cpu", dtype)
    capture = HiddenCapture(model, layer_ids)
    try:
        return [capture.run(torch.tensor([list(r)], dtype=torch.long))[0] for r in rows]
    finally:
        capture.close()


def verdicts(names: Sequence[str], rel: Sequence[float], cos: Sequence[float], bf16: Sequence[float],
             tolerance: float) -> list[LayerAgreement]:
    """One LayerAgreement per column (pure): `bf16-level` when rel <= tolerance x the bf16 yardstick."""
    out = []
    for name, r, c, y in zip(names, rel, cos, bf16, strict=True):
        ratio = r / y if y > 0 else (0.0 if r == 0 else float("inf"))
        out.append(LayerAgreement(layer=name, rel_diff=r, cos_sim=c, bf16_rel_diff=y, ratio=ratio,
                                  verdict=BF16_LEVEL if r <= tolerance * y else DIFFERS))
    return out


def check_engines(model_dir: str | Path, rows: Sequence[Sequence[int]], layer_ids: Sequence[int] | str | None,
                  dtype: str = "bfloat16", tolerance: float = 2.0, flags: Any = None,
                  trust_remote_code: bool = False, concurrency: int = 8, echo: bool = True) -> EngineCheck:
    """Run `rows` through vLLM (one extraction server, started and stopped here) and transformers;
    compare per layer. `dtype`: float32 or bfloat16, the same in both engines."""
    import torch

    from eagle.serving.extraction import extract_vllm
    from eagle.serving.flags import VllmFlags, engine_flags, host_has_cuda, server_spec
    from eagle.target import open_target

    if dtype not in ("float32", "bfloat16"):
        raise EagleError(f"--dtype {dtype}: use float32 or bfloat16", code=2)
    if not rows:
        raise EagleError("--prompts: no prompts to check (the file has no records, or --limit cut them all)", code=2)
    target = open_target(model_dir, trust_remote_code)
    ids = target.layer_ids(layer_ids)
    flags = flags or VllmFlags(trust_remote_code=trust_remote_code)
    t0 = time.monotonic()
    served: dict[int, Any] = dict(extract_vllm(model_dir, rows, ids, flags, dtype=dtype, concurrency=concurrency,
                                               echo=echo))
    vllm_s = time.monotonic() - t0
    spec = server_spec(model_dir, flags, host_has_cuda(), dtype=dtype)
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    same = hf_states(model_dir, rows, ids, torch_dtype[dtype], trust_remote_code)
    fp32 = same if dtype == "float32" else hf_states(model_dir, rows, ids, torch.float32, trust_remote_code)
    bf16 = same if dtype == "bfloat16" else hf_states(model_dir, rows, ids, torch.bfloat16, trust_remote_code)
    engines, rounding = Sums(len(ids) + 1), Sums(len(ids) + 1)
    for i in range(len(rows)):
        engines.add(served[i], same[i])
        rounding.add(bf16[i], fp32[i])
    rel, cos = engines.means()
    yard, _ = rounding.means()
    layers = verdicts([str(k) for k in ids] + ["last"], rel, cos, yard, tolerance)
    return EngineCheck(model=str(model_dir), dtype=dtype, samples=len(rows), tokens=engines.tokens, layer_ids=ids,
                       tolerance=tolerance, layers=layers, agree=all(s.verdict == BF16_LEVEL for s in layers),
                       vllm_seconds=vllm_s, vllm_flags=[f"--{k}" + (f" {v}" if v is not None else "")
                                                        for k, v in engine_flags(spec)])

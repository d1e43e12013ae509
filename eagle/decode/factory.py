"""Which decoder decodes a target, built from the target's and the drafter's directories.

`load_decoder` returns a decode.interface.SpeculativeDecoder: eagle/decode/fast.py's `Decoder`
for the text models it implements (Llama, Qwen3), eagle/decode/generic.py's `GenericDecoder` for
every other one, or the one `path` asks for; `resolve_attention` says what `--attention auto` runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from eagle.common import ATTENTION_CHOICES, EagleError
from eagle.decode.fast import Decoder, TargetModel
from eagle.decode.generic import GenericDecoder
from eagle.decode.interface import SpeculativeDecoder
from eagle.target import FAST_DECODER_TYPES, input_device


def resolve_attention(device: str | torch.device, fast: bool = True) -> str:
    """What `--attention auto` runs: "triton" for the fast decoder on a CUDA device where the Triton
    kernels run, else "sdpa" (the CPU, where Triton only interprets; the generic decoder)."""
    from eagle.decode.triton_attention import unavailable_reason

    dev = torch.device(device)
    return "triton" if fast and dev.type == "cuda" and unavailable_reason(dev) is None else "sdpa"


def eos_ids_of(model_dir: str | Path) -> list[int]:
    """EOS ids as transformers' generate uses them (generation_config, else config)."""
    from eagle.target import open_target

    return open_target(model_dir).eos_ids()


def load_decoder(model_dir: str | Path, draft_dir: str | Path | None = None, *, max_len: int,
                 device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                 layer_ids: Sequence[int] | None = None, use_graphs: bool | None = None,
                 path: str = "auto", trust_remote_code: bool = False,
                 attention: str = "auto") -> SpeculativeDecoder:
    """Target (+ drafter) from their directories, ready to decode.

    path: "fast" (eagle/decode/fast.py: static cache, CUDA graphs; Llama and Qwen3 text models), "generic"
    (eagle/decode/generic.py: the target's own transformers forward with a KV cache; any
    architecture) or "auto" (fast when it implements the target, else generic). The decoder's
    `path` attribute says which ran. attention: the fast decoder's kernels, "sdpa" or "triton"
    (llama_ops.ATTENTION_KERNELS; the generic decoder takes only "sdpa"), or "auto"
    (`resolve_attention`); the decoder's `attention` attribute says which ran."""
    from eagle.decode.draft_infer import load_drafter
    from eagle.target import open_target

    if path not in ("auto", "fast", "generic"):
        raise ValueError(f"decoder path {path!r}: use auto, fast or generic")
    target = open_target(model_dir, trust_remote_code)
    if path == "fast" and not target.fast_decoder:
        raise EagleError(f"--decoder fast: the fast decoder implements {', '.join(FAST_DECODER_TYPES)} text models; "
                         f"{model_dir} is {target.text_model_type!r} (use --decoder generic or auto)", code=2)
    fast = path == "fast" or (path == "auto" and target.fast_decoder)
    if attention not in ATTENTION_CHOICES:
        raise ValueError(f"--attention {attention!r}: use one of {', '.join(ATTENTION_CHOICES)}")
    if attention == "auto":
        attention = resolve_attention(device, fast)
    if attention != "sdpa" and not fast:
        raise EagleError(f"--attention {attention}: only the fast decoder has a choice of attention kernel; "
                         f"{model_dir} decodes with the generic one (use --attention sdpa, or --decoder fast "
                         "for a Llama or Qwen3 target)", code=2)
    if attention == "triton":
        from eagle.decode.triton_attention import require

        require(device)  # before loading any weights
    model = TargetModel.from_pretrained(model_dir, device=device, dtype=dtype) if fast else None
    if model is None:
        model = target.load_model(device, dtype)
    drafter = None
    ids = layer_ids
    if draft_dir is not None:
        embed = target.read_weights(["embed_tokens.weight"])["embed_tokens.weight"]
        dev = model.lm_head.weight.device if fast else input_device(model)
        drafter = load_drafter(draft_dir, target_embed=embed, target_vocab_size=target.vocab_size,
                               target_layers=target.num_layers, device=dev, dtype=dtype)
        if drafter.spec.target_hidden_size != target.hidden_size:
            raise ValueError(f"{draft_dir}: drafter expects target hidden size {drafter.spec.target_hidden_size}, "
                             f"{model_dir} has {target.hidden_size}")
        ids = ids or drafter.spec.layer_ids or target.default_layer_ids()
        if len(ids) != drafter.spec.num_aux:
            raise ValueError(f"{draft_dir}: drafter's fc takes {drafter.spec.num_aux} aux layers, got layer ids {ids}")
    if fast:
        return Decoder(model, drafter, max_len=max_len, layer_ids=ids, eos_ids=target.eos_ids(),
                       use_graphs=use_graphs, attention=attention)
    return GenericDecoder(model, drafter, max_len=max_len, layer_ids=ids, eos_ids=target.eos_ids())

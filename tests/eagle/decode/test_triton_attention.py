"""eagle/decode/triton_attention.py: the split-KV decode attention, and eagle/decode/triton_ops.py: the fused
rope + cache write, RMSNorm and SwiGLU kernels, in Triton's interpreter on the CPU.

The kernel cases run in a child process started with TRITON_INTERPRET=1 (tests/support/_triton_cases.py
says why), against a float64 softmax and against the layers' SDPA path over the same cache. The
kernels compile for a GPU only under `make test-gpu` (tests/gpu/test_gpu.py). One caveat of the
interpreter: it cannot compute on bf16 (triton-lang/triton#11584), so with bf16 inputs the kernel
widens the operands of its two dot products to fp32 there (the same products: bf16 x bf16 is exact
in fp32); the compiled kernel multiplies bf16 natively.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import _decode_helpers as helpers
import _triton_cases as cases
import helpers as H
import pytest

from eagle.common import EagleError

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
# The largest |triton - reference| allowed, by dtype: fp32 differs by summation order only; bf16
# rounds p to bf16 before p @ v and the output to bf16 (8 bits of mantissa; |out| < ~3 here).
TOL = {"fp32": 1e-5, "bf16": 2e-2}
CASES = Path(cases.__file__)


def _child(*args: str, interpret: bool = True, timeout: int = 600) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update({"OMP_NUM_THREADS": "1", **({"TRITON_INTERPRET": "1"} if interpret else {})})
    res = subprocess.run([sys.executable, str(CASES), *args], capture_output=True, text=True, env=env,
                         timeout=timeout)
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def interpreted() -> dict:
    """The attention kernel's cases and triton_ops' cases (_triton_cases.py kernel_cases, ops_cases), both run
    in one interpreter child: the same cases as two children ran, torch and triton imported once (~2 s of CPU)."""
    return _child("kernels+ops")


@pytest.fixture(scope="module")
def kernels(interpreted: dict) -> dict:
    return interpreted["kernels"]


@pytest.mark.parametrize("last", list(cases.LASTS))
@pytest.mark.parametrize("dtype", list(cases.DTYPES))
@pytest.mark.parametrize("g", cases.GS)
@pytest.mark.parametrize("t", cases.TS)
def test_split_kv_attention_equals_sdpa(kernels: dict, t: int, g: int, dtype: str, last: str) -> None:
    """t query rows ending at the first slot, the last slot of a chunk, the first of the next, the
    cache's last slot; g query heads per kv head."""
    case = kernels["cases"][cases.case_id(t, g, dtype, last)]
    assert case["shape_ok"]
    assert case["err_reference"] <= TOL[dtype], f"|triton - float64 reference| = {case['err_reference']:.2e}"
    assert case["err_sdpa"] <= TOL[dtype], f"|triton - sdpa| = {case['err_sdpa']:.2e}"


def test_slots_past_the_last_row_are_never_read(kernels: dict) -> None:
    """NaN in every cache slot after max(slots) leaves the output bit for bit unchanged."""
    assert kernels["nan_past_last_unchanged"] is True


def test_slots_in_any_order_larger_chunks_and_odd_head_dims(kernels: dict) -> None:
    assert kernels["err_unordered"] <= TOL["fp32"]
    assert kernels["err_head_dim_96"] <= TOL["fp32"]
    assert max(kernels["err_many_chunks"]) <= TOL["fp32"]  # 20 chunks: two rounds of the combine
    assert kernels["err_split128"] <= 1e-6


def test_a_layer_over_a_triton_cache_equals_sdpa(kernels: dict) -> None:
    """A 40-row prefill (too many rows for the kernel: SDPA) then a 3-row step (the kernel)."""
    prefill, step = kernels["err_layer"]
    assert prefill == 0.0  # the same SDPA call
    assert step <= TOL["fp32"]


@pytest.fixture(scope="module")
def ops(interpreted: dict) -> dict:
    return interpreted["ops"]


# triton_ops against torch: fp32 by summation order and FMA only; bf16 within one bf16 step of
# the largest values here (|x| < 16), as the interpreter rounds to bf16 toward zero.
OPS_TOL = {"fp32": 2e-6, "bf16": 0.07}


@pytest.mark.parametrize("dtype", list(cases.DTYPES))
def test_fused_norm_and_swiglu_equal_torch(ops: dict, dtype: str) -> None:
    """RMSNorm over 1000 features (a masked tail) and silu(gate) * up over 1500 (two programs a row)."""
    assert ops[f"rms_norm_shape-{dtype}"] == [[3, 1000], f"torch.{'float32' if dtype == 'fp32' else 'bfloat16'}"]
    assert ops[f"rms_norm-{dtype}"] <= OPS_TOL[dtype]
    assert ops[f"silu_mul-{dtype}"] <= OPS_TOL[dtype]


@pytest.mark.parametrize("dtype", list(cases.DTYPES))
def test_fused_norm_keeps_its_input_in_the_same_launch(ops: dict, dtype: str) -> None:
    """`keep` (how the target's aux states are taken): the input lands, bit for bit, in the given
    columns of a wider buffer, nothing else of it is touched, and the norm is unchanged."""
    assert ops[f"rms_norm_keep-{dtype}"] == {"norm_equal": True, "kept_equal": True, "rest_untouched": True}


@pytest.mark.parametrize("dtype", list(cases.DTYPES))
@pytest.mark.parametrize("head_dim", [16, 96])
def test_rope_write_equals_rope_then_cache_writes(ops: dict, head_dim: int, dtype: str) -> None:
    """Queries and cached keys as apply_rope + index_copy_ give them, the kernel reading the rope
    tables at each row's slot (a drafter's tables, position = slot + 1), values copied exactly, at
    slots in any order, and no other cache slot touched."""
    case = ops[f"rope_write-d{head_dim}-{dtype}"]
    assert case["q"] <= OPS_TOL[dtype] and case["k"] <= OPS_TOL[dtype]
    assert case["v_equal"] is True and case["untouched_equal"] is True


def test_accept_kernel_equals_the_torch_bookkeeping(ops: dict) -> None:
    """k = 1, 3, 4 drafts with every number m = 0..k of them accepted (a later draft matching again
    after the first miss must not count): triton_ops.accept and decode.accept_cycle leave n, seq,
    the next cycle's rows and tokens, feat, the history and the counter equal, and right."""
    got = ops["accept"]
    assert [(c["m"], c["n"]) for c in got] == [(m, 7 + m + 1) for k in (1, 3, 4) for m in range(k + 1)]
    for case in got:
        assert {key: v for key, v in case.items() if key not in ("m", "n", "expected_n")} == {
            "equal": True, "next_rows": True, "rows_past_k_kept": True, "first_token": True, "d1": True,
            "feat": True}


def test_token_major_attention_output_is_the_transpose(ops: dict) -> None:
    assert ops["token_major_equal"] is True


def test_kernels_compile_for_the_h200() -> None:
    """Compiled (not run) for sm_90 by triton's own ptxas, no GPU needed: what the interpreter
    would forgive (dot shapes and dtypes, loop-carried types) fails here; shared memory fits the
    H200's 227 KiB per block."""
    out = _child("compile", interpret=False)
    assert set(out["ops"]) == {"rms_norm", "silu_mul", "rope_write", "accept"} and min(out["ops"].values()) > 0
    for dtype in ("bf16", "fp16", "fp32"):
        assert out[dtype]["cubin_bytes"] > 0
        assert out[dtype]["shared"] <= 227 * 1024, out


def test_chunk_size_grows_only_for_long_caches() -> None:
    from eagle.decode.triton_attention import BLOCK_N, MAX_SPLITS, split_size

    assert split_size(192) == BLOCK_N and split_size(BLOCK_N * MAX_SPLITS) == BLOCK_N
    assert split_size(64 * 1024) == 256 and split_size(64 * 1024) * MAX_SPLITS >= 64 * 1024


def test_refusals_name_the_flag_and_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from eagle.decode import llama_ops, triton_attention

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(EagleError, match=r"--attention triton: .*CPU.*use --attention sdpa") as exc:
        triton_attention.require("cpu")
    assert exc.value.code == 2
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    triton_attention.require("cpu")  # the interpreter runs on the CPU
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a))
    with pytest.raises(EagleError, match="triton is not installed.*use --attention sdpa"):
        triton_attention.require("cuda")
    with pytest.raises(ValueError, match="attention 'flash'"):
        llama_ops.KVCache(1, 1, 16, 64, "cpu", torch.float32, attention="flash")


def test_cli_refuses_triton_on_the_cpu_without_the_interpreter(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """`eagle evaluate|bench --attention triton --device cpu`: one line naming the flag and the fix,
    exit 2, no traceback; refused first, before the (here missing) model is looked at."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for verb in ("evaluate", "bench"):
        res = H.eagle_inproc(verb, "--model", str(tmp_path / "no-model"), "--draft", str(tmp_path), "--prompts",
                             str(tmp_path / "p.jsonl"), "--device", "cpu", "--attention", "triton", timeout=300)
        assert res.returncode == 2, res.stderr
        assert "Traceback" not in res.stderr
        assert res.stderr.startswith("error: --attention triton: the device is the CPU"), res.stderr
        assert "use --attention sdpa" in res.stderr


# -- the whole fast decoder ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def random_drafter(toy_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained drafter for the toy target, made once for the module's two tests that read it."""
    return helpers.make_random_drafter(toy_target, tmp_path_factory.mktemp("random-drafter") / "draft")


@pytest.mark.slow  # toy_target (trained once per machine)
def test_fast_decoder_with_triton_attention_equals_sdpa(toy_target: Path, random_drafter: Path,
                                                        tmp_path: Path) -> None:
    """Greedy and speculative decoding on the toy target (float32; a random drafter, so verify
    steps of k+1 rows and drafter steps run the kernel too) give the same tokens with either
    attention kernel.

    The prompt is a toy prompt cut to 2 words: 5 tokens with the chat template (the uncut one had 10).
    Its prefill still takes the kernels, as the 10-token one did (g*t = 10 rows per kv head <= MAX_ROWS;
    masked rows, ROWS_P 16, and masked slots, T_P 8), at half the interpreted programs: each prefill
    runs rope_write on t*(hq+2hkv) programs and the combine on hkv*g*t, in all 8 layers and the drafter's."""
    prompts = helpers.write_prompts(tmp_path / "p.jsonl", 1, words=2)
    out = _child("decoder", str(toy_target), str(random_drafter), str(prompts), "8", "2")
    assert out["triton"]["attention"] == out["triton"]["cache"] == "triton"
    assert out["sdpa"]["greedy"] == out["sdpa"]["speculative"] and len(out["sdpa"]["greedy"]) == 8
    assert out["triton"]["greedy"] == out["sdpa"]["greedy"]
    assert out["triton"]["speculative"] == out["sdpa"]["speculative"]
    assert out["triton"]["verify_steps"] >= 3
    assert out["sdpa"]["kernel_calls"] == 0 and out["triton"]["kernel_calls"] > 8 * 7  # more than the 7 greedy steps x 8 layers


@pytest.mark.slow  # toy_target
def test_the_generic_decoder_refuses_triton(toy_target: Path) -> None:
    from eagle.decode.factory import load_decoder

    with pytest.raises(EagleError, match="--attention triton: only the fast decoder.*use --attention sdpa") as exc:
        load_decoder(toy_target, max_len=64, path="generic", attention="triton")
    assert exc.value.code == 2


def test_auto_runs_triton_only_where_it_compiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--attention auto` (the default): triton for the fast decoder on CUDA with triton installed;
    sdpa on the CPU (even under the interpreter: too slow to be a default), for the generic decoder,
    and where triton is missing."""
    from eagle.decode.factory import resolve_attention

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert resolve_attention("cpu") == "sdpa"
    assert resolve_attention("cuda") == "triton" and resolve_attention("cuda:1") == "triton"
    assert resolve_attention("cuda", fast=False) == "sdpa"
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a))
    assert resolve_attention("cuda") == "sdpa"


@pytest.mark.slow  # toy_target
def test_bench_reports_the_kernels_auto_ran(toy_target: Path, random_drafter: Path, tmp_path: Path) -> None:
    """On the CPU the default --attention auto runs sdpa, and the JSON report says so."""
    prompts = helpers.write_prompts(tmp_path / "p.jsonl", 1)
    res = H.eagle_inproc("bench", "--model", str(toy_target), "--draft", str(random_drafter), "--prompts", str(prompts),
                         "--limit", "1", "--max-new-tokens", "8", "--device", "cpu", "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(res.stdout)["attention"] == "sdpa"

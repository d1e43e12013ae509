"""`eagle extract`: the target's hidden states for every prepared sample (eagle/data/extract.py). The
verb's options, its refusals and its table.
"""

from __future__ import annotations

from pathlib import Path

import click

from eagle import distributed
from eagle.commands._options import device_option, dtype_option, finish, json_option, refusals, vllm_options
from eagle.common import EagleError, human_bytes, quiet_hf
from eagle.data.extract import extract, gather_results, merge_results, parse_shard, summary_metrics
from eagle.serving.flags import vllm_flags


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--model", type=click.Path(path_type=Path), required=True, help="Target model dir.")
@click.option("--data", type=click.Path(path_type=Path), required=True, help="Prepared data dir (`eagle prepare`).")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Write here instead of into --data (the dataset is copied along).")
@click.option("--layer-ids", default=None, help="Aux layers, ascending and distinct, e.g. 2,4,5 [default: 2,N//2,N-3].")
@click.option("--batch-tokens", default=8192, show_default=True, help="Padded tokens per forward pass (lower it if memory runs out).")
@click.option("--backend", type=click.Choice(["hf", "vllm"]), default="hf", show_default=True,
              help="hf: transformers on CPU/GPU; vllm: vLLM's server (tensor parallel, any engine flag via --vllm-arg).")
@click.option("--vllm-concurrency", default=8, show_default=True, type=click.IntRange(1),
              help="With --backend vllm: requests in flight (vLLM batches them).")
@device_option("auto, cpu or cuda[:N] (hf backend).")
@dtype_option("Compute dtype: auto (bf16 on GPU, fp32 on CPU), float32, bfloat16.")
@click.option("--keep-free", "keep_free_gb", default=1.0, show_default=True, help="GB that must stay free on disk after writing.")
@click.option("--shard", default=None, metavar="K/N",
              help="Handle only samples with index % N == K (data parallel; under torchrun: RANK/WORLD_SIZE).")
@json_option()
@vllm_options
def command(model: Path, data: Path, out: Path | None, layer_ids: str | None, batch_tokens: int, backend: str,
            vllm_concurrency: int, device: str, dtype: str, keep_free_gb: float, shard: str | None,
            as_json: bool, vllm_args: tuple[str, ...], trust_remote_code: bool, eager: bool | None) -> None:
    """Extract the target's hidden states for every prepared sample.

    \b
    eagle extract --model work/target --data work/data
    eagle extract --model work/target --data work/data --layer-ids 2,4,5 --batch-tokens 4096

    Writes DATA/hidden_states/hs_{i}.safetensors (hidden_states [T, L+1, H] bf16: aux layers
    ascending, then the pre-norm last layer; token_ids [T]) and DATA/eagle_data.json. Re-running
    skips samples whose file is already valid, so an interrupted run resumes. Refuses to start
    when the disk cannot hold what it will write.
    Metrics: extract_tokens (tokens with hidden states on disk), extract_tok_s (new tokens / seconds
    of this run from before the model load to the last file written), extract_capture_tok_s (new
    tokens / seconds of the capture loop alone, from the first batch to the last file written: model
    load excluded, a GPU's lazy torch.compile of the first batches included; vllm: the server's start
    included), extract_bytes (bytes of hidden-state files on disk).

    \b
    Data parallel (no NCCL; every process writes its own samples' files and the same eagle_data.json):
      torchrun --nproc-per-node 2 -m eagle.cli extract --model ... --data ...   # rank R on cuda:R
      eagle extract ... --shard 0/2 & eagle extract ... --shard 1/2 --device cuda:1
    Under torchrun rank 0 reports the whole run (extract_tok_s and extract_capture_tok_s = all tokens
    / the slowest rank's seconds) plus extract_rank{K}_tokens, _tok_s and _capture_tok_s; a lone
    --shard K/N writes extract_shard{K}_*.
    """
    import torch

    quiet_hf()
    with refusals():
        kn = parse_shard(shard)
        device = distributed.rank_device(device, distributed.topology(), torch.cuda.is_available())
        flags = vllm_flags(vllm_args, trust_remote_code, eager)
        if backend != "vllm" and (vllm_args or eager is not None or vllm_concurrency != 8):
            raise EagleError("--vllm-arg, --vllm-concurrency, --enforce-eager and --compile apply to --backend vllm only")
        res = extract(model, data, out, layer_ids=layer_ids, batch_tokens=batch_tokens, backend=backend,
                      device=device, dtype=dtype, keep_free_gb=keep_free_gb, shard=kn, vllm_flags=flags,
                      vllm_concurrency=vllm_concurrency)
    ranks = gather_results(res) if shard is None else None
    if ranks is not None:
        if not distributed.is_main():
            return
        res = merge_results(ranks)
    finish(res, as_json, metrics=summary_metrics(res, ranks), table={
        "out": res.out,
        "layer ids": ",".join(map(str, res.layer_ids)) + " + last (pre-norm)",
        "shard": res.shard,
        "samples": res.samples,
        "extracted / skipped": f"{res.extracted} / {res.skipped}",
        "tokens": res.tokens,
        "seconds": f"{res.seconds:,.1f} ({res.load_seconds:,.1f} load + {res.capture_seconds:,.1f} capture)",
        "tok/s": f"{res.tok_s:,.1f} (load included)",
        "capture tok/s": f"{res.capture_tok_s:,.1f} (load excluded)",
        **({"tok/s per rank": " ".join(f"{t:,.1f}" for t in res.shard_tok_s)} if res.shard_tok_s else {}),
        **({"capture tok/s per rank": " ".join(f"{t:,.1f}" for t in res.shard_capture_tok_s)}
           if res.shard_capture_tok_s else {}),
        "written": human_bytes(res.bytes_written),
        "on disk": human_bytes(res.total_bytes),
    })

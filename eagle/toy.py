"""Tiny trained targets made locally: `eagle toy-target [--arch llama|qwen3|deepseek_v3|kimi_k25]`.

The toy language is a first-order Markov chain over pronounceable made-up words ("bako",
"tizu", ...): about 400 *active* words, each followed by one of three successors with
probability 0.75 / 0.15 / 0.10. A chat sample is a user turn (a short walk of the chain) and an
assistant turn that continues the walk from the user's last word, wrapped in the chat template

    <|user|> w w w <|end|>
    <|assistant|> w w w ... <|end|>

A small causal LM (Llama by default; Qwen3, DeepSeek-V3 MoE + MLA, or that DeepSeek-V3 inside
Kimi-K2.5's multimodal wrapper with `--arch`) trained on such samples for a few hundred steps gives
peaked greedy outputs (top-1 probability near 0.75, far above the runner-up), which is what makes acceptance
lengths of a drafter meaningful. The vocabulary (and so the tokenizer) depends only on
`--vocab`; the chain depends on `--seed`.

`--base DIR` makes a *successor*: same architecture and tokenizer, initialised from DIR's weights
and trained further on a shifted chain (a fraction of the words get new successors), the way a
model family's next release relates to the previous one.

Weights are saved in float32 (simplest on CPU; extraction casts hidden states to bf16).
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from eagle.common import EagleError, note
from eagle.fsutil import atomic_dir, atomic_write_text

SPECIALS = ["<pad>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
ROLES = ("system", "user", "assistant")
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role: ' + m['role']) }}{% endif %}"
    "<|{{ m['role'] }}|> {{ m['content'] }} <|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SUCCESSOR_PROBS = (0.75, 0.15, 0.10)
META_FILE = "toy_meta.json"
TOY_VERSION = 1  # bump when the corpus or training changes meaningfully (cache keys use it)


ARCHS = ("llama", "qwen3", "deepseek_v3", "kimi_k25")


class ToyConfig(BaseModel):
    """Everything that determines a toy target (a cache key hashes this)."""

    arch: str = "llama"  # one of ARCHS (kimi_k25: the deepseek_v3 toy inside Kimi-K2.5's multimodal wrapper)
    num_layers: int = 8
    hidden: int = 128
    intermediate: int = 256
    heads: int = 4
    kv_heads: int = 2
    vocab: int = 2048
    active: int = 400
    max_positions: int = 512
    steps: int = 300
    batch: int = 16
    lr: float = 3e-3
    seed: int = 0
    # successor only
    shift: float = 0.25


class ToyMeta(BaseModel):
    """Written to DIR/toy_meta.json."""

    toy_version: int = TOY_VERSION
    config: ToyConfig
    base: str | None = None  # the target this one was trained from (successor), else None
    dtype: str = "float32"
    final_loss: float
    build_seconds: float
    chain_seed: int
    shifted_words: int = 0


# ---------------------------------------------------------------- the language (pure)


def make_words(n: int) -> list[str]:
    """`n` distinct pronounceable words, the same for every seed (the tokenizer depends on n only)."""
    cons, vows = "bdfgklmnprstvz", "aeiou"
    syll = [c + v for c in cons for v in vows]
    words: list[str] = [a + b for a in syll for b in syll]
    if n > len(words):
        words += [a + b + c for a in syll for b in syll for c in syll]
    if n > len(words):
        raise EagleError(f"vocab too large for the toy word list ({n} words asked)")
    rng = random.Random(1234)
    head = words[: max(n, 4900)]
    rng.shuffle(head)
    return head[:n]


def vocab_tokens(vocab_size: int) -> list[str]:
    if vocab_size < len(SPECIALS) + 16:
        raise EagleError(f"--vocab {vocab_size} is too small; use at least {len(SPECIALS) + 16}")
    return SPECIALS + make_words(vocab_size - len(SPECIALS))


class Chain(BaseModel):
    """The Markov chain: word -> [(successor, prob), ...] over the active words."""

    active: list[str]
    succ: dict[str, list[str]]

    def step(self, word: str, rng: random.Random) -> str:
        return rng.choices(self.succ[word], weights=SUCCESSOR_PROBS)[0]

    def walk(self, start: str, n: int, rng: random.Random) -> list[str]:
        out, w = [], start
        for _ in range(n):
            w = self.step(w, rng)
            out.append(w)
        return out


def make_chain(vocab_size: int, active: int, seed: int) -> Chain:
    words = vocab_tokens(vocab_size)[len(SPECIALS):]
    if active > len(words) or active < 8:
        raise EagleError(f"--active {active} must be between 8 and the number of words ({len(words)})")
    rng = random.Random(seed)
    act = rng.sample(words, active)
    succ = {w: rng.sample([x for x in act if x != w], len(SUCCESSOR_PROBS)) for w in act}
    return Chain(active=act, succ=succ)


def shift_chain(chain: Chain, fraction: float, seed: int) -> tuple[Chain, int]:
    """A successor language: `fraction` of the words get new successor lists."""
    rng = random.Random(seed + 7919)
    n = round(fraction * len(chain.active))
    changed = rng.sample(chain.active, n)
    succ = dict(chain.succ)
    for w in changed:
        succ[w] = rng.sample([x for x in chain.active if x != w], len(SUCCESSOR_PROBS))
    return Chain(active=chain.active, succ=succ), n


def sample_conversation(chain: Chain, rng: random.Random, with_response: bool = True) -> list[dict[str, str]]:
    """One chat sample: optional system turn, 1-2 user turns each answered by a continuation."""
    msgs: list[dict[str, str]] = []
    if rng.random() < 0.1:
        msgs.append({"role": "system", "content": " ".join(chain.walk(rng.choice(chain.active), rng.randint(2, 5), rng))})
    turns = 2 if with_response and rng.random() < 0.25 else 1
    for _ in range(turns):
        user = chain.walk(rng.choice(chain.active), rng.randint(3, 12), rng)
        msgs.append({"role": "user", "content": " ".join(user)})
        if with_response:
            reply = chain.walk(user[-1], rng.randint(16, 36), rng)
            msgs.append({"role": "assistant", "content": " ".join(reply)})
    return msgs


def make_prompts(n: int, seed: int = 0, cfg: ToyConfig | None = None, salt: int = 0) -> list[dict[str, Any]]:
    """Prompt-only records (OpenAI `messages`) in the toy language of `cfg` (default config)."""
    cfg = cfg or ToyConfig()
    chain = make_chain(cfg.vocab, cfg.active, cfg.seed)
    rng = random.Random(1_000_003 * (salt + 1) + seed)
    return [{"messages": sample_conversation(chain, rng, with_response=False)} for _ in range(n)]


def prompt_sets(n_train: int = 200, n_heldout: int = 24) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The shipped prompt sets (plans/data/prompts.jsonl, prompts-heldout.jsonl): disjoint."""
    train = make_prompts(n_train, salt=0)
    seen = {json.dumps(r, sort_keys=True) for r in train}
    heldout = [r for r in make_prompts(n_heldout * 2, salt=1) if json.dumps(r, sort_keys=True) not in seen]
    return train, heldout[:n_heldout]


def write_prompt_files(out_dir: str | Path) -> None:
    """Regenerate the shipped prompt files:
    .venv/bin/python -c "from eagle.toy import write_prompt_files; write_prompt_files('plans/data')"
    """
    out = Path(out_dir)
    train, heldout = prompt_sets()
    for name, recs in (("prompts.jsonl", train), ("prompts-heldout.jsonl", heldout)):
        (out / name).write_text("".join(json.dumps(r) + "\n" for r in recs))


# ---------------------------------------------------------------- model and tokenizer


def build_tokenizer(vocab_size: int) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(vocab_tokens(vocab_size))}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        unk_token="<unk>",
        pad_token="<pad>",
        eos_token="<|end|>",
        additional_special_tokens=["<|system|>", "<|user|>", "<|assistant|>"],
        model_max_length=512,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def model_config(cfg: ToyConfig, tokenizer: Any) -> Any:
    """The transformers config of a toy target's text model (kimi_k25: of its deepseek_v3 text model).

    qwen3: Llama plus q/k norms, head_dim explicit. deepseek_v3: MoE (8 routed experts of width
    intermediate/4, top 2, 1 shared expert, the first layer dense, DeepSeek-V3's sigmoid routing with
    a correction bias) and MLA with DeepSeek-V3's kv_lora_rank 512 and rope head 64 (vLLM's CPU MLA
    kernel takes only those), small q_lora_rank and per-head nope/v sizes."""
    from transformers import DeepseekV3Config, LlamaConfig, Qwen3Config

    if cfg.arch not in ARCHS:
        raise EagleError(f"--arch {cfg.arch!r}: use one of {', '.join(ARCHS)}")
    if cfg.num_layers < 8:
        raise EagleError(
            f"--num-layers {cfg.num_layers}: use at least 8 so the default layer ids [2, N//2, N-3] are distinct"
        )
    if cfg.hidden % cfg.heads or cfg.heads % cfg.kv_heads:
        raise EagleError("--hidden must be divisible by --heads, and --heads by --kv-heads")
    common = dict(vocab_size=cfg.vocab, hidden_size=cfg.hidden, intermediate_size=cfg.intermediate,
                  num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.heads,
                  max_position_embeddings=cfg.max_positions, tie_word_embeddings=False,
                  pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    if cfg.arch == "llama":
        return LlamaConfig(**common, num_key_value_heads=cfg.kv_heads, rms_norm_eps=1e-5)
    if cfg.arch == "qwen3":
        return Qwen3Config(**common, num_key_value_heads=cfg.kv_heads, head_dim=cfg.hidden // cfg.heads,
                           rms_norm_eps=1e-6)
    head = cfg.hidden // cfg.heads
    return DeepseekV3Config(**common, num_key_value_heads=cfg.heads, rms_norm_eps=1e-6,
                            n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
                            moe_intermediate_size=max(8, cfg.intermediate // 4), first_k_dense_replace=1,
                            n_group=1, topk_group=1, routed_scaling_factor=1.0,
                            q_lora_rank=2 * cfg.hidden, kv_lora_rank=512, qk_rope_head_dim=64,
                            qk_nope_head_dim=head, v_head_dim=head,
                            topk_method="noaux_tc", scoring_func="sigmoid")  # type: ignore[call-arg]  # kept by its **kwargs, which the stub leaves out; as DeepSeek-V3's config.json


def build_model(cfg: ToyConfig, tokenizer: Any) -> Any:
    """A fresh causal LM of the toy's text architecture (kimi_k25's wrapper is added at save time)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(model_config(cfg, tokenizer))


def _encode_samples(tokenizer: Any, convs: list[list[dict[str, str]]]) -> list[list[int]]:
    texts = [tokenizer.apply_chat_template(c, tokenize=False) for c in convs]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def train(model: Any, tokenizer: Any, chain: Chain, cfg: ToyConfig, seed: int, steps: int,
          echo: bool = True) -> float:
    """Train `model` on fresh samples of `chain`; returns the mean loss of the last 20 steps.

    Runs on one CPU thread: bit-identical results for a seed on any machine, and on a shared
    2-core host one thread is faster than two fighting for the cores.
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train_loop(model, tokenizer, chain, cfg, seed, steps, echo)
    finally:
        torch.set_num_threads(threads)


def _train_loop(model: Any, tokenizer: Any, chain: Chain, cfg: ToyConfig, seed: int, steps: int,
                echo: bool) -> float:
    import torch

    torch.manual_seed(seed)
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01, betas=(0.9, 0.98))
    warm = max(1, min(30, steps // 10))

    def lr_at(s: int) -> float:
        if s < warm:
            return (s + 1) / warm
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, steps - warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    pad = tokenizer.pad_token_id
    model.train()
    recent: list[float] = []
    t0 = time.time()
    for s in range(steps):
        ids = _encode_samples(tokenizer, [sample_conversation(chain, rng) for _ in range(cfg.batch)])
        width = min(max(map(len, ids)), cfg.max_positions)
        x = torch.full((len(ids), width), pad, dtype=torch.long)
        att = torch.zeros_like(x)
        for i, row in enumerate(ids):
            row = row[:width]
            x[i, : len(row)] = torch.tensor(row)
            att[i, : len(row)] = 1
        labels = x.masked_fill(att == 0, -100)
        loss = model(input_ids=x, attention_mask=att, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        recent = (recent + [loss.item()])[-20:]
        if echo and (s % 25 == 0 or s == steps - 1):
            note(f"  step {s + 1:>4}/{steps}  loss {loss.item():.3f}  ({time.time() - t0:.0f}s)")
    model.eval()
    return sum(recent) / max(1, len(recent))


def build_toy_target(out: Path, cfg: ToyConfig, echo: bool = True, text_from: Path | None = None) -> ToyMeta:
    """Make, train and save a toy target at `out` (which must not exist or be empty).

    kimi_k25: the deepseek_v3 toy (trained here, or taken trained from the toy at `text_from`)
    inside Kimi-K2.5's multimodal wrapper."""
    import torch

    t0 = time.time()
    torch.manual_seed(cfg.seed)
    tok = build_tokenizer(cfg.vocab)
    text_cfg = cfg.model_copy(update={"arch": "deepseek_v3"}) if cfg.arch == "kimi_k25" else cfg
    if text_from is not None:
        from transformers import AutoModelForCausalLM

        given = read_toy_meta(text_from)
        if given.config != text_cfg:
            raise EagleError(f"{text_from} is not the {text_cfg.arch} toy of this config")
        model = AutoModelForCausalLM.from_pretrained(str(text_from), dtype=torch.float32).eval()
        loss = given.final_loss
    else:
        model = build_model(text_cfg, tok)
        chain = make_chain(cfg.vocab, cfg.active, cfg.seed)
        loss = train(model, tok, chain, cfg, seed=cfg.seed, steps=cfg.steps, echo=echo)
    meta = ToyMeta(config=cfg, final_loss=loss, build_seconds=0.0, chain_seed=cfg.seed)
    if cfg.arch == "kimi_k25":
        model = wrap_kimi_k25(model)
    return _save(out, model, tok, meta, t0)


def wrap_kimi_k25(text_model: Any) -> Any:
    """Kimi-K2.5's layout around a DeepSeek-V3 causal LM: `Kimi_K25ForConditionalGeneration` with the
    text model under `text_config` and a tiny random vision tower and projector (never used by
    text prompts). The text weights are the given model's, so it decodes exactly as that model."""
    import torch
    from transformers import Kimi_K25Config, Kimi_K25ForConditionalGeneration

    tc = text_model.config
    vocab = tc.vocab_size
    config = Kimi_K25Config(
        text_config=tc.to_dict(),
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2, "num_hidden_layers": 1,
                       "patch_size": 14, "pos_emb_height": 8, "pos_emb_width": 8, "pos_emb_time": 2},
        projection_hidden_size=32, tie_word_embeddings=False,
        # media placeholder ids: past the toy vocabulary's words, as Kimi's are past its text tokens
        image_token_id=vocab - 4, video_token_id=vocab - 3, vision_start_token_id=vocab - 2,
        vision_end_token_id=vocab - 1)
    torch.manual_seed(0)
    model = Kimi_K25ForConditionalGeneration(config).eval()
    model.model.language_model.load_state_dict(text_model.model.state_dict())
    with torch.no_grad():
        model.lm_head.weight.copy_(text_model.lm_head.weight)
    return model


# Kimi-K2.5's published preprocessor_config.json (vLLM's native Kimi-K2.5 builds its image
# processor from it even when serving text only).
KIMI_MEDIA_PROC_CFG = {
    "in_patch_limit": 16384, "patch_size": 14, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "merge_kernel_size": 2, "fixed_output_tokens": None, "patch_limit_on_one_side": 512,
    "in_patch_limit_each_frame": 4096, "in_patch_limit_video": None, "sample_fps": 2.0,
    "max_num_frames_each_video": None, "temporal_merge_kernel_size": 4, "timestamp_mode": "hh:mm:ss.fff",
    "config_type": "image"}
KIMI_LAYOUT = 3  # bump when _original_kimi_layout changes (the kimi_k25 cache key includes it)


def _original_kimi_layout(out: Path) -> None:
    """Make a saved Kimi_K25ForConditionalGeneration look like Kimi-K2.5's published checkpoint, which
    vLLM's native Kimi-K2.5 loads and transformers reads as well: architectures
    KimiK25ForConditionalGeneration; decoder layers `language_model.model.layers.N` (transformers 5.19
    writes `...blocks.N`) and the projector's norm `mm_projector.pre_norm` (it writes
    `model.mm_projector.pre_norm`); `media_placeholder_token_id`, which vLLM's EAGLE-3 path reads from a
    Kimi-K2.5 target (vllm/v1/spec_decode/llm_base_proposer.py; transformers' config calls it
    `image_token_id`); the image processor config."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    file = out / "model.safetensors"
    with safe_open(str(file), framework="pt") as fh:
        meta = fh.metadata()
        tensors = {k.replace("language_model.model.blocks.", "language_model.model.layers.")
                   .replace("model.mm_projector.", "mm_projector.", 1)
                   if k.startswith(("language_model.", "model.mm_projector.")) else k: fh.get_tensor(k)
                   for k in fh.keys()}
    save_file(tensors, str(file), metadata=meta)
    cfg = json.loads((out / "config.json").read_text())
    cfg["architectures"] = ["KimiK25ForConditionalGeneration"]
    cfg["media_placeholder_token_id"] = cfg["image_token_id"]
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "preprocessor_config.json").write_text(json.dumps({"media_proc_cfg": KIMI_MEDIA_PROC_CFG}, indent=2) + "\n")


def build_successor(base: Path, out: Path, steps: int | None = None, shift: float | None = None,
                    seed: int | None = None, echo: bool = True) -> ToyMeta:
    """Train a copy of the toy target at `base` further on a shifted chain; save it at `out`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.time()
    base_meta = read_toy_meta(base)
    if base_meta.config.arch == "kimi_k25":
        raise EagleError(f"--base {base}: successors of the kimi_k25 toy are not supported (make one of its "
                         "deepseek_v3 toy)")
    cfg = base_meta.config.model_copy()
    if steps is not None:
        cfg.steps = steps
    else:
        cfg.steps = max(50, cfg.steps * 2 // 3)
    if shift is not None:
        cfg.shift = shift
    train_seed = (seed if seed is not None else base_meta.config.seed) + 1
    torch.manual_seed(train_seed)
    tok = AutoTokenizer.from_pretrained(str(base))
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    chain, n_changed = shift_chain(make_chain(cfg.vocab, cfg.active, base_meta.chain_seed), cfg.shift, train_seed)
    cfg.lr = cfg.lr / 3  # a gentler continuation of training, as a new release would be
    loss = train(model, tok, chain, cfg, seed=train_seed, steps=cfg.steps, echo=echo)
    meta = ToyMeta(config=cfg, base=str(base), final_loss=loss, build_seconds=0.0,
                   chain_seed=base_meta.chain_seed, shifted_words=n_changed)
    return _save(out, model, tok, meta, t0)


def _save(out: Path, model: Any, tok: Any, meta: ToyMeta, t0: float) -> ToyMeta:
    from transformers import GenerationConfig

    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, do_sample=False
    )
    model.save_pretrained(str(out))
    if meta.config.arch == "kimi_k25":
        _original_kimi_layout(out)
    tok.save_pretrained(str(out))
    meta.build_seconds = round(time.time() - t0, 2)
    (out / META_FILE).write_text(meta.model_dump_json(indent=1) + "\n")
    return meta


def read_toy_meta(path: Path) -> ToyMeta:
    f = Path(path) / META_FILE
    if not f.is_file():
        raise EagleError(f"{path} is not a toy target (no {META_FILE}); make one with `eagle toy-target --out {path}`")
    return ToyMeta.model_validate_json(f.read_text())


def greedy_peakedness(model_dir: Path, prompts: list[dict[str, Any]], max_new_tokens: int = 32) -> dict[str, float]:
    """Mean top-1 probability and top-1 minus top-2 margin along greedy continuations."""
    import torch

    from eagle.target import open_target

    target = open_target(model_dir)
    tok = target.load_tokenizer()
    model = target.load_model("cpu", torch.float32)
    top1, margin = [], []
    with torch.no_grad():
        for rec in prompts:
            text = tok.apply_chat_template(rec["messages"], tokenize=False, add_generation_prompt=True)
            ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
            out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False,
                                 output_scores=True, return_dict_in_generate=True)
            for sc in out.scores:
                p = torch.softmax(sc[0].float(), -1)
                v = torch.topk(p, 2).values
                top1.append(v[0].item())
                margin.append((v[0] - v[1]).item())
    return {"top1": sum(top1) / len(top1), "margin": sum(margin) / len(margin), "tokens": float(len(top1))}


# ---------------------------------------------------------------- cache (tests, demo)


def cache_root() -> Path:
    """$EAGLE_CACHE, else ~/.cache/runbook-eagle."""
    return Path(os.environ.get("EAGLE_CACHE") or Path.home() / ".cache" / "runbook-eagle")


def cache_key(cfg: ToyConfig, successor: bool) -> str:
    """Hash of the config, TOY_VERSION and the transformers version (bump TOY_VERSION on changes)."""
    import hashlib

    import transformers

    fields = cfg.model_dump(exclude={"arch"} if cfg.arch == "llama" else None)  # llama keys as before arch existed
    if cfg.arch == "kimi_k25":
        fields["kimi_layout"] = KIMI_LAYOUT
    blob = json.dumps([TOY_VERSION, transformers.__version__, successor, fields], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cached_target(cfg: ToyConfig | None = None, successor: bool = False, root: Path | None = None,
                  echo: bool = False) -> Path:
    """A toy target (or the successor of the cached base) built once and reused.

    Safe when several processes race: an flock serialises the builders, each builds into a temp
    dir and renames it into place, and a finished dir (with toy_meta.json) is never rebuilt.
    """
    import fcntl

    cfg = cfg or ToyConfig()
    root = root or cache_root()
    root.mkdir(parents=True, exist_ok=True)
    base = cached_target(cfg, False, root, echo) if successor else None
    text = cached_target(cfg.model_copy(update={"arch": "deepseek_v3"}), False, root, echo) \
        if cfg.arch == "kimi_k25" else None  # the wrapper around the cached deepseek_v3 toy: no training
    name = ("successor-" if successor else "target-") + cache_key(cfg, successor)
    final = root / name
    if (final / META_FILE).is_file():
        return final
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / META_FILE).is_file():
            return final
        with atomic_dir(final) as tmp:  # replaces a broken leftover without toy_meta.json
            if base is not None:
                build_successor(base, tmp, steps=None, shift=cfg.shift, echo=echo)
            else:
                build_toy_target(tmp, cfg, echo=echo, text_from=text)
    return final


def from_cache(out: Path, cfg: ToyConfig, echo: bool = True) -> ToyMeta:
    """`eagle toy-target` with $EAGLE_CACHE set: the toy of `cfg` taken from the per-machine cache
    (built there first when missing) and copied to `out`."""
    import shutil

    shutil.copytree(cached_target(cfg, echo=echo), out, dirs_exist_ok=True)
    return read_toy_meta(out)


def successor_from_cache(out: Path, base: Path, echo: bool = True) -> ToyMeta | None:
    """`eagle toy-target --base` with $EAGLE_CACHE set and the default steps, shift and seed: the
    successor of `base` from the cache, copied to `out`, when `base` holds exactly the cached toy of
    its config (the same weights, byte for byte); else None: build it here."""
    import shutil

    base_cfg = read_toy_meta(base).config
    cached_base = cache_root() / ("target-" + cache_key(base_cfg, False))
    weights = "model.safetensors"
    if not (cached_base / META_FILE).is_file() or not (base / weights).is_file() or \
            (base / weights).read_bytes() != (cached_base / weights).read_bytes():
        return None
    shutil.copytree(cached_target(base_cfg, successor=True, echo=echo), out, dirs_exist_ok=True)
    meta = read_toy_meta(out).model_copy(update={"base": str(base)})  # as if built from `base` here
    atomic_write_text(out / META_FILE, meta.model_dump_json(indent=1) + "\n")
    return meta

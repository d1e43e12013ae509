"""The target model: the one place that knows what `--model DIR` is.

Every eagle command that reads a target asks this module, never config.json itself:

- `open_target(DIR)` reads config.json once (plain JSON: no transformers, no custom code) and
  finds the text model in it, also when a multimodal wrapper nests it under `text_config` /
  `language_config` / `llm_config` (Kimi-K2.5, Qwen3-VL, Llama-4 layouts): its model_type, number
  of decoder layers, hidden size, vocabulary, dtype;
- the aux layer ids: `default_layer_ids(N)` = [2, N//2, N-3] and `check_layer_ids`, ONE rule for
  every command: non-empty, distinct, ascending, each in [0, N) (id k = the input of decoder layer
  k, transformers' `hidden_states[k]`);
- `Target.read_weights` reads the text model's embedding, lm_head and final norm from the
  safetensors files (only the shards holding them, through the index), whatever prefix the
  wrapper puts in front (`model.`, `language_model.model.`, `model.language_model.`);
- `Target.load_tokenizer` / `Target.load_model` load with `trust_remote_code` only when the user
  passed `--trust-remote-code` (the error says to pass it when the target needs it) and place a
  model too big for one GPU across the visible GPUs with `device_map="auto"`;
- `Target.draft_layer_config` is the drafter's decoder layer: one Llama layer whatever the target,
  its shape the target's unless the user sets it (`DraftShape`, eagle/drafter/model.py builds it).

Problems with the user's input are EagleErrors with exit code 2, naming the file and the fix.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from eagle.common import (
    EagleError,
    check_dir_files,
    check_file,
    open_safetensors,
    pick_device,
    pick_dtype,
    split_layer_ids,
)
from eagle.fsutil import JsonFileError, read_json_file

CONFIG_FILE = "config.json"
TEXT_KEYS = ("text_config", "language_config", "llm_config")
# The text fields without which nothing here can work.
TEXT_FIELDS = ("num_hidden_layers", "hidden_size", "vocab_size")
# Text model types the fast CUDA-graph decoder (eagle/decode/fast.py) implements.
FAST_DECODER_TYPES = ("llama", "qwen3")
USAGE = 2  # exit code of a bad --model / --layer-ids / drafter shape


def _usage(msg: str) -> EagleError:
    return EagleError(msg, code=USAGE)


# ---------------------------------------------------------------- layer ids (pure)
def default_layer_ids(num_layers: int) -> list[int]:
    """[2, N//2, N-3]: what speculators and vLLM use when a drafter names none."""
    return [2, num_layers // 2, num_layers - 3]


def check_layer_ids(ids: Sequence[int], num_layers: int, where: str = "--layer-ids") -> list[int]:
    """The one rule for aux layer ids: non-empty, distinct, ascending, each in [0, N)."""
    ids = [int(i) for i in ids]
    if not ids:
        raise _usage(f"{where}: no layer ids given")
    bad = [i for i in ids if not 0 <= i < num_layers]
    if bad:
        raise _usage(f"{where} {ids}: {bad} out of range; the target has {num_layers} decoder layers "
                     f"(use 0..{num_layers - 1})")
    if len(set(ids)) != len(ids):
        raise _usage(f"{where} {ids}: ids must be distinct (these collide)")
    if ids != sorted(ids):
        raise _usage(f"{where} {ids}: give them in ascending order ({','.join(map(str, sorted(ids)))})")
    return ids


def resolve_layer_ids(spec: str | Sequence[int] | None, num_layers: int, where: str = "--layer-ids") -> list[int]:
    """`--layer-ids` as given (text "2,4,5", a list, or None for the default), checked."""
    if spec is None or spec == "":
        ids = default_layer_ids(num_layers)
        if len(set(ids)) != len(ids) or min(ids) < 0:
            raise _usage(f"the default layer ids {ids} for a {num_layers}-layer target collide; "
                         "pass --layer-ids explicitly (3 distinct ascending ids)")
        return ids
    if isinstance(spec, str):
        ids = split_layer_ids(spec)
    else:
        ids = [int(x) for x in spec]
    return check_layer_ids(ids, num_layers, where)


# ---------------------------------------------------------------- the drafter's layer shape
class DraftShape(BaseModel):
    """The drafter's decoder-layer shape; None = the target's (set on its own by flags or a file)."""

    model_config = ConfigDict(extra="forbid")

    intermediate_size: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    head_dim: int | None = None

    def is_default(self) -> bool:
        return all(v is None for v in self.model_dump().values())

    def set_fields(self) -> list[str]:
        return [k for k, v in self.model_dump().items() if v is not None]


def read_draft_shape(file: str | os.PathLike[str]) -> DraftShape:
    """A drafter shape file: JSON with any of intermediate_size, num_attention_heads,
    num_key_value_heads, head_dim (a published drafter's config.json works too: its
    transformer_layer_config, or its top-level llama fields, are read)."""
    path = Path(file)
    try:
        data = read_json_file(path)
    except JsonFileError as exc:
        raise _usage(f"--draft-config {exc}") from None
    except json.JSONDecodeError as exc:
        raise _usage(f"--draft-config {path}:{exc.lineno}:{exc.colno}: invalid JSON ({exc.msg})") from None
    if not isinstance(data, dict):
        raise _usage(f"--draft-config {path}: expected a JSON object with intermediate_size, "
                     "num_attention_heads, num_key_value_heads, head_dim")
    if isinstance(data.get("transformer_layer_config"), dict):
        data = data["transformer_layer_config"]
    fields = DraftShape.model_fields
    picked = {k: data[k] for k in fields if data.get(k) is not None}
    if not picked:
        raise _usage(f"--draft-config {path}: none of {', '.join(fields)} in it")
    bad = [k for k, v in picked.items() if not isinstance(v, int) or isinstance(v, bool) or v < 1]
    if bad:
        raise _usage(f"--draft-config {path}: {', '.join(bad)} must be positive integers")
    return DraftShape(**picked)


def merge_shape(base: DraftShape, override: DraftShape) -> DraftShape:
    """Flags over a shape file."""
    return DraftShape(**{**base.model_dump(), **{k: v for k, v in override.model_dump().items() if v is not None}})


# ---------------------------------------------------------------- reading a target
class Target(BaseModel):
    """What eagle knows about a target directory, from its config.json alone."""

    model_config = ConfigDict(frozen=True)

    path: str
    model_type: str  # config.json's own (e.g. kimi_k25)
    text_model_type: str  # the text model's (e.g. deepseek_v3); == model_type when not nested
    text_key: str | None  # where the text config sits (None: top level)
    num_layers: int
    hidden_size: int
    vocab_size: int
    dtype: str | None  # as saved (config "dtype" / "torch_dtype")
    custom_code: bool  # config.json has an auto_map: loading runs the directory's Python files
    trust_remote_code: bool = False
    text: dict[str, Any]  # the text config as written
    raw: dict[str, Any]  # the whole config.json

    # -- simple facts ---------------------------------------------------------------------
    @property
    def dir(self) -> Path:
        return Path(self.path)

    @property
    def config_file(self) -> Path:
        return self.dir / CONFIG_FILE

    @property
    def nested(self) -> bool:
        return self.text_key is not None

    @property
    def fast_decoder(self) -> bool:
        """Whether eagle/decode/fast.py's fast decoder implements this target's text model."""
        return self.text_model_type in FAST_DECODER_TYPES

    def default_layer_ids(self) -> list[int]:
        return resolve_layer_ids(None, self.num_layers)

    def layer_ids(self, spec: str | Sequence[int] | None, where: str = "--layer-ids") -> list[int]:
        try:
            return resolve_layer_ids(spec, self.num_layers, where)
        except EagleError as exc:
            raise _usage(f"{exc} ({self.path})") from None

    def eos_ids(self) -> list[int]:
        """EOS ids as transformers' generate uses them: generation_config.json, else config.json
        (text config first)."""
        eos = None
        gen = self.dir / "generation_config.json"
        if check_file(gen, "JSON file"):  # a FIFO there is refused, never skipped (it would change the eos ids)
            try:
                data = read_json_file(gen)
                eos = data.get("eos_token_id") if isinstance(data, dict) else None
            except (JsonFileError, json.JSONDecodeError):
                eos = None
        if eos is None:
            eos = self.text.get("eos_token_id", self.raw.get("eos_token_id"))
        if eos is None:
            return []
        return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]

    # -- transformers objects -------------------------------------------------------------
    def _needs_code(self, exc: Exception, what: str) -> EagleError | None:
        return _needs_code(self.path, exc, what)

    def auto_config(self) -> Any:
        """transformers' config of the whole model (custom code only with trust_remote_code)."""
        from transformers import AutoConfig

        check_dir_files(self.dir, "transformers")
        try:
            return AutoConfig.from_pretrained(self.path, trust_remote_code=self.trust_remote_code)
        except (OSError, ValueError, KeyError) as exc:
            raise self._needs_code(exc, "config") or _usage(f"{self.config_file}: transformers cannot read it "
                                                            f"({exc})") from None

    def text_config(self) -> Any:
        """transformers' config of the text model (the nested one for multimodal wrappers)."""
        cfg = self.auto_config()
        return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg

    def load_tokenizer(self, need_chat_template: bool = True) -> Any:
        return load_tokenizer(self.path, self.trust_remote_code, need_chat_template)

    def load_model(self, device: Any = "cpu", dtype: Any = None) -> Any:
        """The whole model (causal LM, or a multimodal wrapper whose text model decodes), in eval
        mode: on `device`, or spread over every visible GPU when it does not fit on one
        (`placement`). Inputs go to `input_device(model)`."""
        import torch
        from transformers import AutoModelForCausalLM

        dev = torch.device(device)
        kwargs: dict[str, Any] = {"trust_remote_code": self.trust_remote_code}
        if dtype is not None:
            kwargs["dtype"] = dtype
        spread = dev.type == "cuda" and dev.index is None and placement(
            self.weight_bytes(dtype), _gpu_free_bytes()) == "auto"
        if spread:
            kwargs["device_map"] = "auto"
        check_dir_files(self.dir, "transformers")  # it takes a FIFO for a missing file, or blocks on it
        try:
            try:
                model = AutoModelForCausalLM.from_pretrained(self.path, **kwargs)
            except ValueError as exc:
                if "Unrecognized configuration class" not in str(exc):
                    raise
                from transformers import AutoModelForImageTextToText  # multimodal wrappers (Kimi-K2.5, ...)

                model = AutoModelForImageTextToText.from_pretrained(self.path, **kwargs)
        except (OSError, ValueError, KeyError, ImportError) as exc:
            if spread and "accelerate" in str(exc):
                raise EagleError(f"{self.path} does not fit on one GPU and spreading it over "
                                 f"{torch.cuda.device_count()} needs the `accelerate` package: pip install "
                                 "accelerate") from None
            raise self._needs_code(exc, "model code") or EagleError(
                f"cannot load the target model at {self.path}: {exc}") from None
        except torch.cuda.OutOfMemoryError:
            raise EagleError(f"{self.path} does not fit in the memory of {dev}; make more GPUs visible "
                             "(it is then spread over them) or use a smaller dtype") from None
        except Exception as exc:  # SafetensorError: truncated or random-bytes weights; shape errors
            raise EagleError(f"cannot load the target model at {self.path}: {exc}; are its weight files "
                             "complete?") from None
        if not spread:
            model = model.to(dev)  # type: ignore[arg-type]  # transformers' decorated .to() has a wrong signature
        return model.eval()

    # -- weights without loading the model -----------------------------------------------
    @cached_property
    def weight_map(self) -> dict[str, str]:
        """Tensor name -> safetensors file (from the index, else the single file's header)."""

        index = self.dir / "model.safetensors.index.json"
        if check_file(index, "safetensors index"):
            try:
                return dict(read_json_file(index)["weight_map"])
            except (JsonFileError, json.JSONDecodeError, KeyError, TypeError) as exc:
                raise EagleError(f"{index}: unreadable safetensors index ({exc})") from None
        single = self.dir / "model.safetensors"
        if check_file(single, "weights file"):
            with open_safetensors(single, what="weights file") as fh:
                return dict.fromkeys(fh.keys(), "model.safetensors")
        raise EagleError(f"{self.dir}: no model.safetensors (or model.safetensors.index.json); eagle reads the "
                         "target's weights from safetensors files (re-save it with save_pretrained)")

    @cached_property
    def text_prefix(self) -> str:
        """The prefix of the text model's decoder weights, e.g. 'model.' or 'language_model.model.'."""
        name = "embed_tokens.weight"
        hits = [k for k in self.weight_map if k == name or k.endswith("." + name)]
        if not hits:
            raise EagleError(f"{self.dir}: no tensor named *embed_tokens.weight in its safetensors; "
                             "cannot find the text model's embedding")
        return min(hits, key=len)[: -len(name)]

    def text_weight_names(self) -> dict[str, str]:
        """Canonical name (embed_tokens.weight, norm.weight, lm_head.weight, layers.N...) -> name
        in the files, for the text model's tensors (vision towers and projectors left out)."""
        prefix = self.text_prefix
        out = {k[len(prefix):]: k for k in self.weight_map if k.startswith(prefix)}
        heads = [k for k in self.weight_map if k == "lm_head.weight" or k.endswith(".lm_head.weight")]
        if heads:
            out["lm_head.weight"] = min(heads, key=len)
        return out

    def read_weights(self, names: Sequence[str], device: str = "cpu") -> dict[str, Any]:
        """Canonical text-model tensors by name, reading only the shards that hold them.
        `lm_head.weight` falls back to the embedding when the target ties them."""

        where = self.text_weight_names()
        if "lm_head.weight" not in where and "embed_tokens.weight" in where:
            where["lm_head.weight"] = where["embed_tokens.weight"]  # tied
        missing = [n for n in names if n not in where]
        if missing:
            raise EagleError(f"{self.dir}: no {', '.join(missing)} for the text model (prefix {self.text_prefix!r}) "
                             "in its safetensors files")
        by_file: dict[str, list[str]] = {}
        for n in names:
            by_file.setdefault(self.weight_map[where[n]], []).append(n)
        out: dict[str, Any] = {}
        for file, wanted in by_file.items():
            with open_safetensors(self.dir / file, device=device, what="weights file") as fh:
                for n in wanted:
                    out[n] = fh.get_tensor(where[n])
        return out

    def read_text_state(self, device: str = "cpu") -> dict[str, Any]:
        """Every tensor of the text model under its canonical name (the fast decoder's input)."""
        names = [n for n in self.text_weight_names() if not n.startswith("rotary_emb.")]
        if "lm_head.weight" not in names:
            names.append("lm_head.weight")
        return self.read_weights(names, device)

    def weight_bytes(self, dtype: Any = None) -> int:
        """Bytes of the weights in `dtype` (as saved when None), from the safetensors headers."""

        total = 0
        per = None
        if dtype is not None:
            import torch

            per = torch.tensor([], dtype=dtype).element_size()
        for file in sorted(set(self.weight_map.values())):
            with open_safetensors(self.dir / file, what="weights file") as fh:
                for name in fh.keys():
                    sl = fh.get_slice(name)
                    n = 1
                    for d in sl.get_shape():
                        n *= d
                    size = per or {"F64": 8, "F32": 4, "I64": 8, "I32": 4, "F16": 2, "BF16": 2}.get(sl.get_dtype(), 1)
                    total += n * size
        return total

    # -- the drafter's decoder layer ------------------------------------------------------
    def draft_layer_config(self, shape: DraftShape | None = None) -> Any:
        """A 1-layer LlamaConfig for the drafter: the target's hidden size, vocabulary, norm eps,
        rope and positions; the layer shape (intermediate size, heads, kv heads, head dim) the
        target's, or `shape`'s fields where set. Raises (exit 2) on a shape whose heads do not
        divide, naming the fix."""
        from transformers import LlamaConfig

        shape = shape or DraftShape()
        t = self.text
        hidden = self.hidden_size
        if self.text_model_type == "llama" and not self.nested:
            base = {k: v for k, v in t.items() if k not in ("architectures", "auto_map", "model_type")}
        else:
            base = {"hidden_size": hidden, "vocab_size": self.vocab_size,
                    "rms_norm_eps": t.get("rms_norm_eps", 1e-6),
                    "max_position_embeddings": t.get("max_position_embeddings", 2048),
                    "rope_parameters": _plain_rope(t)}
            heads = int(t.get("num_attention_heads") or max(1, hidden // 128))
            mla = "kv_lora_rank" in t  # MLA's head sizes are no Llama layer's: the hidden // heads split
            head_dim = t.get("head_dim") if not mla else None
            base.update({
                "intermediate_size": int(t.get("intermediate_size") or 4 * hidden),
                "num_attention_heads": heads,
                "num_key_value_heads": int(t.get("num_key_value_heads") or heads) if not mla else heads,
                "head_dim": int(head_dim) if head_dim else None,
            })
        for key, value in shape.model_dump().items():
            if value is not None:
                base[key] = value
        heads = int(base["num_attention_heads"])
        kv = int(base.get("num_key_value_heads") or heads)
        head_dim = base.get("head_dim")
        fix = "set --draft-heads / --draft-kv-heads / --draft-head-dim (or --draft-config FILE)"
        if heads % kv:
            raise _usage(f"drafter shape for {self.path}: {heads} attention heads are not a multiple of {kv} kv "
                         f"heads; {fix} so that kv heads divide heads")
        if hidden % heads:  # transformers' LlamaConfig requires it even with an explicit head dim
            raise _usage(f"drafter shape for {self.path}: hidden size {hidden} is not divisible by {heads} "
                         f"heads; {fix}: a head count dividing {hidden}")
        if not head_dim:
            head_dim = hidden // heads
        if int(head_dim) % 2:
            raise _usage(f"drafter shape for {self.path}: head dim {head_dim} is odd (rope needs it even); {fix}")
        base.update(num_key_value_heads=kv, head_dim=int(head_dim), num_hidden_layers=1, tie_word_embeddings=False,
                    use_cache=True, hidden_act="silu", mlp_bias=False, attention_bias=False)
        base.pop("num_nextn_predict_layers", None)
        return LlamaConfig(**base)


def _needs_code(path: str, exc: Exception, what: str) -> EagleError | None:
    """The exit-2 error for transformers refusing custom code without trust_remote_code."""
    text = str(exc)
    if "trust_remote_code" in text or "custom code" in text:
        return _usage(f"{path}: the target's {what} is custom code (auto_map in its config.json / "
                      "tokenizer_config.json); pass --trust-remote-code to run it (it executes the Python "
                      "files in that directory: only for code you trust)")
    return None


def load_tokenizer(path: str | os.PathLike[str], trust_remote_code: bool = False,
                   need_chat_template: bool = True) -> Any:
    """The tokenizer in a model directory (a tokenizer-only directory works too)."""
    from transformers import AutoTokenizer

    if not Path(path).is_dir():
        raise _usage(f"--model {path}: no such directory")
    check_dir_files(path, "transformers")  # it takes a FIFO or a directory for a missing file: a tokenizer without it
    try:
        tok = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as exc:
        raise _needs_code(str(path), exc, "tokenizer") or EagleError(
            f"cannot load a tokenizer from {path}: {exc}") from None
    if need_chat_template and not getattr(tok, "chat_template", None):
        raise EagleError(f"the tokenizer at {path} has no chat template; prompts and loss masks need one "
                         "(add chat_template to its tokenizer_config.json)")
    return tok


def _plain_rope(text: dict[str, Any]) -> dict[str, Any]:
    """The target's rope for a Llama layer: its theta and a scaling Llama implements (llama3,
    linear, yarn without DeepSeek's mscale extras); anything else becomes default rope."""
    rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    theta = float(rope.get("rope_theta", text.get("rope_theta", 10000.0)))
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind in ("llama3", "linear"):
        return {**{k: v for k, v in rope.items() if k != "type"}, "rope_type": kind, "rope_theta": theta}
    return {"rope_type": "default", "rope_theta": theta}


def _gpu_free_bytes() -> list[int]:
    import torch

    if not torch.cuda.is_available():
        return []
    return [torch.cuda.mem_get_info(i)[0] for i in range(torch.cuda.device_count())]


def placement(weight_bytes: int, gpu_free: Sequence[int], headroom: float = 0.85) -> str:
    """'cuda' when the weights fit in one GPU's free memory (with headroom for activations and the
    KV cache), 'auto' (device_map across all) when they fit only together, else 'cuda' (and the load
    reports the out-of-memory)."""
    if not gpu_free or weight_bytes <= headroom * gpu_free[0]:
        return "cuda"
    return "auto" if len(gpu_free) > 1 and weight_bytes <= headroom * sum(gpu_free) else "cuda"


def input_device(model: Any) -> Any:
    """Where a (possibly spread) model takes its input ids: its embedding's device."""
    return model.get_input_embeddings().weight.device


def open_target(path: str | os.PathLike[str], trust_remote_code: bool = False, what: str = "--model") -> Target:
    """Read DIR/config.json and find the text model in it; exit-2 EagleErrors naming the fix."""
    d = Path(path)
    if not d.is_dir():
        raise _usage(f"{what} {d}: no such directory (give a transformers model directory)")
    file = d / CONFIG_FILE
    if not file.exists():  # a FIFO, a device or a directory there is named by read_json_file
        raise _usage(f"{what} {d}: no config.json (expected a transformers model directory, "
                     "as save_pretrained writes it)")
    try:
        raw = read_json_file(file)
    except JsonFileError as exc:
        raise _usage(str(exc)) from None
    except json.JSONDecodeError as exc:
        raise _usage(f"{file}:{exc.lineno}:{exc.colno}: invalid JSON ({exc.msg}); fix or re-save the config") from None
    if not isinstance(raw, dict):
        raise _usage(f"{file}: expected a JSON object")
    text, key = raw, None
    if not all(f in raw for f in TEXT_FIELDS):
        for k in TEXT_KEYS:
            if isinstance(raw.get(k), dict) and all(f in raw[k] for f in TEXT_FIELDS):
                text, key = raw[k], k
                break
        else:
            missing = [f for f in TEXT_FIELDS if f not in raw]
            raise _usage(f"{file}: no text model found: {', '.join(missing)} missing at the top level and no "
                         f"{' / '.join(TEXT_KEYS)} holding them; point {what} at the language model's directory, "
                         "or add its config under text_config")
    problems = [f for f in TEXT_FIELDS if not isinstance(text[f], int) or isinstance(text[f], bool) or text[f] < 1]
    if problems:
        where = f"{key}." if key else ""
        raise _usage(f"{file}: {', '.join(where + f for f in problems)} must be positive integers")
    model_type = str(raw.get("model_type") or "")
    text_type = str(text.get("model_type") or model_type)
    if text_type == "kimi_k2":  # Kimi-K2's text model is DeepSeek-V3's architecture
        text_type = "deepseek_v3"
    dtype = text.get("dtype") or text.get("torch_dtype") or raw.get("dtype") or raw.get("torch_dtype")
    return Target(path=str(d), model_type=model_type, text_model_type=text_type, text_key=key,
                  num_layers=int(text["num_hidden_layers"]), hidden_size=int(text["hidden_size"]),
                  vocab_size=int(text["vocab_size"]), dtype=str(dtype) if dtype else None,
                  custom_code=bool(raw.get("auto_map")), trust_remote_code=trust_remote_code, text=text, raw=raw)


def load_model(path: str | os.PathLike[str], device_name: str = "auto", dtype_name: str = "auto",
               trust_remote_code: bool = False) -> Any:
    """The target model at a local directory, on the chosen device/dtype (common.pick_device /
    pick_dtype names), in eval mode: causal LMs and multimodal wrappers, custom code only with
    trust_remote_code, big ones spread over GPUs (Target.load_model)."""
    device = pick_device(device_name)
    return open_target(path, trust_remote_code).load_model(device, pick_dtype(dtype_name, device))

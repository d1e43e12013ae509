"""A Qwen3-style reasoning target for tests: the chat template, a word tokenizer, and a real
Qwen3ForCausalLM whose greedy answer is fixed by construction (a "bigram machine").

Template: the structure of Qwen3's own (`<|im_start|>role\\n...<|im_end|>\\n`, tools in the system
turn, the reasoning of assistant turns before the last user message dropped, `enable_thinking=false`
puts an empty `<think>\\n\\n</think>\\n\\n` in the generation prompt).

Model: hidden size = vocabulary size, one-hot embeddings, every attention and MLP output projection
zero, so the last hidden state is the current token's one-hot; the lm_head maps each token to its
successor in `SUCCESSOR`. Greedy decoding after the generation prompt (which ends in "\\n") therefore
produces `ANSWER` = <think> hmm so </think> \\n\\n yes done <|im_end|>: a reasoning block, special
tokens and an end-of-turn token, in vLLM and transformers alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

QWEN3_STYLE_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools <tools>' }}{%- for tool in tools %}{{- ' ' + tool.function.name }}{%- endfor %}"
    "{{- ' </tools><|im_end|>\\n' }}"
    "{%- else %}{%- if messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- endif %}{%- endif %}"
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}"
    "{%- for message in messages[::-1] %}{%- set index = (messages|length - 1) - loop.index0 %}"
    "{%- if ns.multi_step_tool and message.role == 'user' and message.content is string and "
    "not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}"
    "{%- set ns.multi_step_tool = false %}{%- set ns.last_query_index = index %}{%- endif %}{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message.content is string %}{%- set content = message.content %}{%- else %}{%- set content = '' %}{%- endif %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{%- set reasoning_content = '' %}"
    "{%- if message.reasoning_content is string %}{%- set reasoning_content = message.reasoning_content %}"
    "{%- else %}{%- if '</think>' in content %}"
    "{%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}{%- endif %}"
    "{%- if loop.index0 > ns.last_query_index %}"
    "{%- if loop.last or (not loop.last and reasoning_content) %}"
    "{{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' "
    "+ content.lstrip('\\n') }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + content }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + content }}{%- endif %}"
    "{%- if message.tool_calls %}{%- for tool_call in message.tool_calls %}"
    "{%- if (loop.first and content) or (not loop.first) %}{{- '\\n' }}{%- endif %}"
    "{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '<tool_call>\\n' + tool_call.name + '\\n</tool_call>' }}{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or (messages[loop.index0 - 1].role != 'tool') %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]
ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "\n\n", "\n"]
WORDS = ["system", "user", "assistant", "tool", "hello", "there", "again", "please", "hmm", "so", "yes", "done",
         "weather", "sunny", "get_weather", "#", "Tools", "<tools>", "</tools>", "be", "brief"]
VOCAB = SPECIAL + ADDED + WORDS  # ids in this order; the model's vocab is padded to HIDDEN
HIDDEN = 64

# greedy successor of each token (everything else -> <|im_end|>)
SUCCESSOR = {"\n": "<think>", "<think>": "hmm", "hmm": "so", "so": "</think>", "</think>": "\n\n", "\n\n": "yes",
             "yes": "done", "done": "<|im_end|>"}
ANSWER = ["<think>", "hmm", "so", "</think>", "\n\n", "yes", "done", "<|im_end|>"]


def build_tokenizer() -> Any:
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(VOCAB)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.add_special_tokens([AddedToken(t, normalized=False) for t in SPECIAL])
    tk.add_tokens([AddedToken(t, normalized=False) for t in ADDED])
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", pad_token="<|endoftext|>",
                                   eos_token="<|im_end|>", model_max_length=512)
    fast.chat_template = QWEN3_STYLE_TEMPLATE
    return fast


def build_target(out: Path, tok: Any = None, successor: dict[str, str] | None = None) -> Path:
    """Save the tokenizer and the bigram-machine Qwen3 at `out` (float32, ~100 KB): greedy decoding
    follows `successor` (default SUCCESSOR; every other token -> the eos token). Another word
    tokenizer (`tok`, at most HIDDEN tokens) makes the same machine under its own chat template."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    tok = tok or build_tokenizer()
    successor = successor or SUCCESSOR
    ids = tok.get_vocab()
    vocab = sorted(ids, key=ids.get)
    eos, pad = tok.eos_token_id, tok.pad_token_id
    cfg = Qwen3Config(vocab_size=HIDDEN, hidden_size=HIDDEN, intermediate_size=HIDDEN, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=512,
                      tie_word_embeddings=False, rms_norm_eps=1e-6, eos_token_id=eos, pad_token_id=pad,
                      bos_token_id=None)
    model = Qwen3ForCausalLM(cfg).float().eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(torch.eye(HIDDEN))
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.norm.weight.fill_(1.0)
        head = torch.zeros(HIDDEN, HIDDEN)
        for t in range(HIDDEN):
            nxt = successor.get(vocab[t]) if t < len(vocab) else None
            head[ids[nxt] if nxt is not None else eos, t] = 1.0
        model.lm_head.weight.copy_(head)
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=pad)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out

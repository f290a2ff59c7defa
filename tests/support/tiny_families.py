"""Tiny random-weight models of the 2026 small-model families (Qwen3, Llama 3, Mistral, Phi-4-mini and -reasoning,
DeepSeek-R1-Distill-Qwen, Gemma 3), built with ONNX Runtime GenAI's model builder in seconds, with the default
model's tokenizer plus the family's special tokens and the family's real chat template (tests/data/templates). Their
words are noise: tests drive them with grammars and check what phi-api makes of the family's markup and template."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phi_api.tools.prepare import REFERENCE_RECIPE, run_builder

TEMPLATES = Path(__file__).resolve().parents[1] / "data" / "templates"


@dataclass(frozen=True)
class Family:
    """A family's architecture (transformers' names), special tokens and template."""

    name: str
    config: str  # transformers' config class
    model: str  # transformers' causal-LM class
    special: tuple[str, ...]  # added to the tokenizer (special ones; the second ends a turn)
    # the call and thinking markers that are not special tokens (Qwen's); Llama 3's <|python_tag|> and Mistral's
    # [TOOL_CALLS] are special in their tokenizers, and so here
    text_tokens: tuple[str, ...] = ()
    template: str = ""  # a file of tests/data/templates
    extra: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, str] = field(default_factory=dict)  # the server's, where the folder cannot say it


FAMILIES = {family.name: family for family in (
    Family("qwen3", "Qwen3Config", "Qwen3ForCausalLM", ("<|im_start|>", "<|im_end|>"),
           ("<think>", "</think>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_suffix|>",
            "<|fim_middle|>"), "qwen3.jinja", {"head_dim": 16}),  # (Qwen's tokenizers hold the FIM tokens too)
    Family("llama", "LlamaConfig", "LlamaForCausalLM", ("<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>",
                                                        "<|end_header_id|>", "<|python_tag|>"),
           template="llama3.2-json.jinja"),
    Family("mistral", "MistralConfig", "MistralForCausalLM", ("[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                                                            "[/AVAILABLE_TOOLS]"), template="mistral-tools.jinja"),
    Family("phi4-mini", "Phi3Config", "Phi3ForCausalLM", ("<|user|>", "<|end|>", "<|assistant|>", "<|system|>",
                                                          "<|tool|>", "<|/tool|>", "<|tool_call|>", "<|/tool_call|>"),
           template="phi4-mini.jinja", extra={"original_max_position_embeddings": 2048}),  # no LongRoPE here
    # its thinking markers are no tokens of the tiny tokenizer: read as text (REASONING_PARSER=think)
    Family("phi4-mini-reasoning", "Phi3Config", "Phi3ForCausalLM",
           ("<|user|>", "<|end|>", "<|assistant|>", "<|system|>", "<|tool|>", "<|/tool|>", "<|tool_call|>",
            "<|/tool_call|>"), template="phi4-mini-reasoning.jinja", settings={"REASONING_PARSER": "think"},
           extra={"original_max_position_embeddings": 2048}),
    # its template ends the prompt with <think>: only </think> appears in the answer
    Family("deepseek-r1-distill", "Qwen2Config", "Qwen2ForCausalLM",
           ("<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<\uff5cend\u2581of\u2581sentence\uff5c>",
            "<\uff5cUser\uff5c>", "<\uff5cAssistant\uff5c>"),
           ("<think>", "</think>"), "deepseek-r1-distill-qwen.jinja"),
    # sliding-window layers (a window of 16 tokens, shorter than the prompts) besides a global one; Python-style
    # calls, as vLLM's Gemma 3 tool template asks for them, read with TOOL_PARSER=pythonic
    Family("gemma3", "Gemma3TextConfig", "Gemma3ForCausalLM", ("<start_of_turn>", "<end_of_turn>"),
           template="gemma3-pythonic.jinja", settings={"TOOL_PARSER": "pythonic"},
           extra={"head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 16,
                  "layer_types": ["sliding_attention", "full_attention"]}),
)}


def build_tinies(families: list[Family], tokenizer_source: Path, work_dir: Path) -> dict[str, Path]:
    """Build the families' tiny models under ``work_dir``: each one's folder by name. The Hugging Face folders are
    written here, one at a time (transformers' lazy module is not safe to load from several threads); the model
    builder, a process mostly on one core, runs for two at a time."""
    from concurrent.futures import ThreadPoolExecutor

    for family in families:
        _write_folder(family, tokenizer_source, work_dir / f"tiny-{family.name}-hf")

    def build(family: Family) -> Path:
        out_dir = work_dir / f"tiny-{family.name}"
        run_builder(work_dir / f"tiny-{family.name}-hf", out_dir, work_dir / f"tiny-{family.name}-cache",
                    work_dir / f"tiny-{family.name}.log", recipe=REFERENCE_RECIPE)
        if family.template:
            (out_dir / "chat_template.jinja").write_text((TEMPLATES / family.template).read_text(encoding="utf-8"),
                                                         encoding="utf-8")
        return out_dir

    with ThreadPoolExecutor(2) as pool:
        return dict(zip([family.name for family in families], pool.map(build, families), strict=True))


def _write_folder(family: Family, tokenizer_source: Path, out_dir: Path) -> None:
    import torch
    import transformers
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_source)
    tokenizer.add_special_tokens({"additional_special_tokens": list(family.special)})
    tokenizer.add_tokens([AddedToken(text, special=False, normalized=False) for text in family.text_tokens])
    tokenizer.chat_template = None
    tokenizer.save_pretrained(out_dir)
    eos = tokenizer.convert_tokens_to_ids(family.special[1])
    config = getattr(transformers, family.config)(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, bos_token_id=0,
        eos_token_id=eos, pad_token_id=eos, tie_word_embeddings=False, **family.extra)
    torch.manual_seed(0)
    model = getattr(transformers, family.model)(config)
    model.save_pretrained(out_dir)
    transformers.GenerationConfig(eos_token_id=[eos], pad_token_id=eos).save_pretrained(out_dir)
    config_path = out_dir / "tokenizer_config.json"
    settings = json.loads(config_path.read_text(encoding="utf-8"))
    settings.pop("chat_template", None)
    config_path.write_text(json.dumps(settings, indent=2), encoding="utf-8")

"""What a model folder says of itself beyond genai_config.json: its fill-in-the-middle tokens, by family."""

from __future__ import annotations

import json

import pytest

from phi_api.engine.runtime.folder import FIM_FAMILIES, ModelFolder, fim_tokens


def folder_with(tmp_path, added: list[str]):
    (tmp_path / "genai_config.json").write_text(json.dumps({"model": {"type": "qwen2"}}))
    tokens = [{"id": 1000 + index, "content": name, "special": True} for index, name in enumerate(added)]
    (tmp_path / "tokenizer.json").write_text(json.dumps({"added_tokens": tokens}), encoding="utf-8")
    return ModelFolder.read(tmp_path)


@pytest.mark.parametrize("family", FIM_FAMILIES)
def test_each_family_s_fill_in_the_middle_tokens_are_found_in_prefix_suffix_middle_order(tmp_path, family):
    shuffled = ["<|im_start|>", family[2], family[0], "<|im_end|>", family[1]]
    ids = {name: 1000 + index for index, name in enumerate(shuffled)}
    found = fim_tokens(folder_with(tmp_path, shuffled).added_tokens())
    assert found == (ids[family[0]], ids[family[1]], ids[family[2]])


def test_a_tokenizer_without_a_whole_family_has_none(tmp_path):
    mixed = folder_with(tmp_path, ["<|fim_prefix|>", "<|fim_suffix|>", "<fim_middle>"])
    assert fim_tokens(mixed.added_tokens()) is None
    assert fim_tokens(folder_with(tmp_path, []).added_tokens()) is None
    (tmp_path / "tokenizer.json").write_text("not json")
    assert fim_tokens(ModelFolder.read(tmp_path).added_tokens()) is None


def test_call_and_thinking_markers_special_or_not_are_decoded_as_their_text():
    from phi_api.engine.runtime.folder import marker_tokens
    from phi_api.engine.runtime.model import LockedStream
    from phi_api.engine.threads.native import new_lock

    markers = marker_tokens({"<|python_tag|>": 7, "<|eot_id|>": 8, "[TOOL_CALLS]": 9, "</think>": 10, "<think>": 4})
    assert markers == ((7, "<|python_tag|>"), (9, "[TOOL_CALLS]"), (4, "<think>"), (10, "</think>"))

    class SkippingSpecial:  # ONNX Runtime GenAI's stream: a special token completes no text
        def __init__(self) -> None:
            self.seen: list[int] = []

        def decode(self, token: int) -> bytes:
            self.seen.append(token)
            return {4: b"<think>", 7: b"", 8: b"", 9: b"", 10: b""}.get(token, b"x")  # here <think> is not special

    stream = SkippingSpecial()
    locked = LockedStream(stream, new_lock(), {token: text.encode() for token, text in markers})  # type: ignore
    assert [locked.decode(token) for token in (1, 7, 8, 9, 4, 10)] == [
        b"x", b"<|python_tag|>", b"", b"[TOOL_CALLS]", b"<think>", b"</think>"]
    assert stream.seen == [1, 7, 8, 9, 4, 10]  # the stream saw every token: its state stays whole


def _template(first: list[dict], tokens: dict) -> dict:
    return {"type": "TemplateProcessing", "single": [*first, {"Sequence": {"id": "A", "type_id": 0}}],
            "special_tokens": tokens}


def test_the_tokens_a_tokenizer_puts_before_a_text_are_read_from_its_post_processor():
    from phi_api.engine.runtime.folder import prompt_prefix

    bos = {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]}}
    gemma = _template([{"SpecialToken": {"id": "<bos>", "type_id": 0}}], bos)
    assert prompt_prefix({"post_processor": gemma}) == (2,)
    # Llama 3's: a Sequence of a byte-level step and the template
    llama = {"type": "Sequence", "processors": [{"type": "ByteLevel"}, gemma]}
    assert prompt_prefix({"post_processor": llama}) == (2,)
    # SmolLM2's and Qwen's: the text alone
    assert prompt_prefix({"post_processor": _template([], {})}) == ()
    assert prompt_prefix({"post_processor": None}) == ()
    assert prompt_prefix({}) == ()
    broken = _template([{"SpecialToken": {"id": "<bos>", "type_id": 0}}], {})
    assert prompt_prefix({"post_processor": broken}) == ()


def test_the_sliding_window_is_read_from_genai_config(tmp_path):
    from phi_api.engine.runtime.spec import DecoderSpec

    decoder = {"num_hidden_layers": 2, "num_key_value_heads": 1, "head_size": 8}
    config = {"model": {"type": "gemma3_text", "vocab_size": 16, "context_length": 64, "decoder": decoder}}
    (tmp_path / "genai_config.json").write_text(json.dumps(config))
    assert DecoderSpec.read(tmp_path).window == 0
    decoder["sliding_window"] = {"window_size": 512, "layers": [0]}
    (tmp_path / "genai_config.json").write_text(json.dumps(config))
    assert DecoderSpec.read(tmp_path).window == 512

"""The raw bytes of every token, read from the model folder's ``tokenizer.json``.

Log-probability answers carry each token's UTF-8 bytes, also for tokens that
hold only part of a character. Two vocabulary spellings cover the models we
serve: byte-level BPE (GPT-2 style: every byte is spelled by one printable
character; SmolLM2, Llama 3) and SentencePiece-style BPE (``▁`` for a space
and ``<0xNN>`` byte fallbacks; Llama 2, Phi-3).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-to-character map, reversed: printable stand-in character -> byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    characters = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            characters.append(256 + extra)
            extra += 1
    return {chr(character): byte for byte, character in zip(printable, characters, strict=True)}


def _is_byte_level(tokenizer: dict) -> bool:
    parts = [tokenizer.get("decoder") or {}, tokenizer.get("pre_tokenizer") or {}]
    for part in list(parts):
        parts.extend(part.get("decoders", []) + part.get("pretokenizers", []))
    return any(part.get("type") == "ByteLevel" for part in parts)


def token_bytes(tokenizer_json: Path) -> dict[int, bytes]:
    """Token id -> the bytes that token stands for."""
    tokenizer = json.loads(Path(tokenizer_json).read_text(encoding="utf-8"))
    vocab: dict[str, int] = dict(tokenizer.get("model", {}).get("vocab", {}))
    table: dict[int, bytes] = {}
    if _is_byte_level(tokenizer):
        alphabet = _byte_level_alphabet()
        for piece, token in vocab.items():
            table[token] = bytes(alphabet[character] for character in piece if character in alphabet)
    else:
        for piece, token in vocab.items():
            fallback = _BYTE_FALLBACK.match(piece)
            table[token] = bytes([int(fallback.group(1), 16)]) if fallback else piece.replace("\u2581", " ").encode()
    for added in tokenizer.get("added_tokens", []):
        table[added["id"]] = added["content"].encode("utf-8")
    return table

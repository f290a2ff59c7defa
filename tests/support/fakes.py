"""A small fake model for unit tests: scripted tokens, real scheduler, no weights.

Token ``i`` decodes to ``PIECES[i]`` (bytes, so a character can be split
across tokens); ``EOS`` ends a generation. A test can make a step block until
it says so (``gate``), or fail.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from phi_api.engine import Engine, ModelInfo

EOS = 0
VOCAB = 64


@dataclass
class Script:
    """What the fake generator will produce, and how."""

    tokens: list[int]
    gate: threading.Semaphore | None = None  # acquired before each decode step when set
    fail_at: int | None = None  # raise at this decode step
    steps: list[str] = field(default_factory=list)  # what the generator did, for assertions
    chunks: list[tuple[int, int]] = field(default_factory=list)  # (offset, length) of every prompt step
    logits_seen: list[np.ndarray] = field(default_factory=list)
    options: list[dict[str, Any]] = field(default_factory=list)


class FakeGenerator:
    """Emits the script's tokens; honours max_length, min_length and logits edits like the real one."""

    def __init__(self, script: Script, options: dict[str, Any]) -> None:
        self._script = script
        self._options = options
        self._length = 0
        self._step = 0
        self._done = False
        self.closed = False
        self.threads: set[int] = set()  # the OS threads that stepped this generator
        script.options.append(options)

    def append_tokens(self, tokens: Any) -> None:
        self._script.chunks.append((self._length, len(tokens)))
        self._length += len(tokens)
        self._script.steps.append(f"prefill:{len(tokens)}")

    def process_logits(self, process: Any) -> None:
        logits = np.zeros(VOCAB, dtype=np.float32)
        process(logits)
        self._script.logits_seen.append(logits.copy())
        self._forced = int(np.argmax(logits)) if logits.max() > 50 else None

    def generate_next_token(self) -> int:
        self.threads.add(threading.get_ident())
        if self._script.gate is not None:
            self._script.gate.acquire()
        if self._script.fail_at == self._step:
            raise RuntimeError("fake engine failure")
        forced = getattr(self, "_forced", None)
        token = forced if forced is not None else self._script.tokens[self._step % len(self._script.tokens)]
        self._forced = None
        if token == EOS and self._length < self._options.get("min_length", 0):
            token = 1  # the engine masks EOS below min_length
        self._step += 1
        self._length += 1
        self._script.steps.append(f"token:{token}")
        self._done = token == EOS or self._length >= self._options["max_length"]
        return token

    def is_done(self) -> bool:
        return self._done

    def rewind_to(self, length: int) -> None:
        self._script.steps.append(f"rewind:{length}")
        self._length = length
        self._done = False

    def close(self) -> None:
        self.closed = True


class FakeStream:
    def __init__(self, pieces: dict[int, bytes]) -> None:
        self._pieces = pieces

    def decode(self, token: int) -> bytes:
        return self._pieces.get(token, b"")

    def close(self) -> None:
        pass


class FakeModel:
    """Text is encoded one token per character (``ord % VOCAB``); tokens decode through ``pieces``."""

    def __init__(self, script: Script, pieces: dict[int, bytes], *, context_length: int = 512,
                 has_chat_template: bool = True) -> None:
        self.script = script
        self.pieces = pieces
        self.info = ModelInfo(
            path="/fake", model_type="fake", context_length=context_length, vocab_size=VOCAB,
            eos_token_ids=frozenset({EOS}), has_chat_template=has_chat_template, fingerprint="fp_fake",
            kv_bytes_per_token=1,
        )
        self.generators: list[FakeGenerator] = []
        self.rendered: list[str] = []  # every prompt the chat template produced

    @property
    def token_bytes(self) -> dict[int, bytes]:
        return self.pieces

    @property
    def longest_token_bytes(self) -> int:
        return max((len(piece) for piece in self.pieces.values()), default=0)

    def encode(self, text: str) -> np.ndarray:
        return np.array([1 + ord(ch) % (VOCAB - 1) for ch in text], dtype=np.int32)

    def decode(self, tokens: Any) -> str:
        return b"".join(self.pieces.get(int(t), b"") for t in tokens).decode("utf-8", "replace")

    def render_chat(self, messages: list[dict[str, Any]], tools: Any = None, add_generation_prompt: bool = True) -> str:
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages) + ("<assistant>" if add_generation_prompt else "")
        self.rendered.append(text)
        return text

    def new_generator(self, options: dict[str, Any], guidance: Any = None) -> FakeGenerator:
        generator = FakeGenerator(self.script, {**options, "guidance": guidance} if guidance else options)
        self.generators.append(generator)
        return generator

    def create_stream(self) -> FakeStream:
        return FakeStream(self.pieces)


def text_pieces(*pieces: bytes) -> dict[int, bytes]:
    """Token ids 1..n for the given byte pieces (0 is EOS)."""
    return {index + 1: piece for index, piece in enumerate(pieces)}


def fake_engine(tokens: list[int], pieces: dict[int, bytes], *, timeout: float = 60.0, prefill_chunk: int = 8,
                cache_bytes: int = 0, cache_headroom: int = 0, **model_options: Any) -> Engine:
    """An Engine over a FakeModel running ``tokens``."""
    return Engine(FakeModel(Script(tokens), pieces, **model_options), prefill_chunk=prefill_chunk, timeout=timeout,
                  cache_bytes=cache_bytes, cache_headroom=cache_headroom)

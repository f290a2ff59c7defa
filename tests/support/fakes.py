"""A small fake model for unit tests: scripted tokens, the real scheduler and sampler, no weights.

Token ``i`` decodes to ``PIECES[i]`` (bytes, so a character can be split
across tokens); ``EOS`` ends a generation. The fake decoder behaves like the
real graph where the scheduler can tell: it writes something for every token
it is fed into the row's key/value buffer (the index of the token it chose
at that step), at the row's own offset, so a sequence's place in its script
travels with its row through joins, leaves, moves and prompt reuse. Its
logits are 0 but for the scripted token's, :data:`SCRIPTED_LOGIT`; the real
:class:`~phi_api.engine.sampling.logits.Sampler` chooses from them. A test can make a
step block until it says so (``gate``), or a decode step fail.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from phi_api.engine import Engine, EngineConfig, ModelInfo
from phi_api.engine.runtime.pool import KVPool
from phi_api.engine.runtime.spec import DecoderSpec

EOS = 0
VOCAB = 64
SCRIPTED_LOGIT = 30.0  # any other token: a chance of 63 x e^-30 (6e-12) a step, when sampling


@dataclass
class Script:
    """What the fake model will produce, and a record of what it was asked."""

    tokens: list[int]
    gate: threading.Semaphore | None = None  # acquired before each step when set
    fail_at: int | None = None  # raise at this decode step (counted over the whole engine)
    steps: list[str] = field(default_factory=list)  # "prefill:N" and "decode:ROWS", in order
    chunks: list[tuple[int, int]] = field(default_factory=list)  # (offset, length) of every prompt step
    chunk_firsts: list[int] = field(default_factory=list)  # the first token id of every prompt step
    logits_seen: list[np.ndarray] = field(default_factory=list)  # each row's logits, as the sampler left them
    params: list[Any] = field(default_factory=list)  # the SamplingParams of every submitted choice
    priorities: list[int] = field(default_factory=list)  # the priority of every submitted request
    prompts: list[list[int]] = field(default_factory=list)  # the token ids of every submitted prompt
    cache_keys: list[str] = field(default_factory=list)  # the cache key of every submitted request
    grammars: list[tuple[str, str]] = field(default_factory=list)
    threads: set[int] = field(default_factory=set)  # the OS threads that ran steps
    decoder_threads: list[int] = field(default_factory=list)  # the intra-op threads each session was made with
    # What a step "takes" on the engine's clock: a fixed cost (a 1-row decode step's) and a cost per prompt token
    # or further row. The engine's clock is this script's: chunk plans do not depend on this machine.
    step_seconds: float = 0.01
    token_seconds: float = 0.001
    check_token_seconds: float = 0.0  # what each draft token adds to a check's step
    pass_rows: int = 0  # a decode step's matrices go in passes of this many token-rows (phi-api's kernels: 8), and
    pass_seconds: float = 0.0  # each pass past the first adds this
    now: float = 0.0

    def clock(self) -> float:
        return self.now


class FakeDecoder:
    """The decoder graph's contract, with scripted logits."""

    def __init__(self, script: Script, rope_switch: int | None = None, row_wise: bool = False,
                 multi_token_rows: bool = False) -> None:
        self.script = script
        self.spec = DecoderSpec(layers=1, kv_heads=1, head_size=16, vocab_size=VOCAB, rope_switch=rope_switch,
                                row_wise=row_wise, kv_layout="tiles16" if multi_token_rows else "")
        self._decode_steps = 0

    def step(self, kv: KVPool, first: int, ids: np.ndarray, past: np.ndarray, prefill: bool,
             every_position: bool = False) -> np.ndarray:
        script = self.script
        script.threads.add(threading.get_ident())
        count, new = ids.shape
        script.now += script.step_seconds + script.token_seconds * (new if prefill else count - 1)
        if not prefill:
            script.now += script.check_token_seconds * (new - 1) * count
            if script.pass_rows:
                script.now += script.pass_seconds * ((count * new - 1) // script.pass_rows)
        marks = kv.keys[0]
        logits = np.zeros((count, VOCAB), dtype=np.float32)
        if script.gate is not None:
            script.gate.acquire()
        if prefill:
            script.steps.append(f"prefill:{new}")
            script.chunks.append((int(past[0]), new))
            script.chunk_firsts.append(int(ids[0, 0]))
            chosen = [0]
        elif new > 1:  # drafts' checks: as many decode steps of each row, in one
            assert count == 1 or self.spec.multi_token_rows, "several new tokens for several rows"
            return self._check(kv, first, ids, past, every_position)
        else:
            if script.fail_at == self._decode_steps:
                raise RuntimeError("fake engine failure")
            self._decode_steps += 1
            script.steps.append(f"decode:{count}")
            chosen = [int(marks[first + row, 0, int(past[row]) - 1, 0]) + 1 for row in range(count)]
        for row in range(count):
            marks[first + row, 0, int(past[row]):int(past[row]) + new, 0] = chosen[row]
            # The values hold each position's token (plus one: a row never written reads 0), so a test can tell
            # which tokens a row's keys and values stand for.
            kv.values[0][first + row, 0, int(past[row]):int(past[row]) + new, 0] = ids[row] + 1
            logits[row, script.tokens[chosen[row] % len(script.tokens)]] = SCRIPTED_LOGIT
            script.logits_seen.append(logits[row])
        if every_position and prefill:  # a prompt chunk: after each of its tokens, the token after it is likeliest
            return prompt_logits(ids[0], logits[0])[None]
        return logits[:, None, :] if every_position else logits

    def unbind(self) -> None:
        pass

    def _check(self, kv: KVPool, first: int, ids: np.ndarray, past: np.ndarray, every_position: bool) -> np.ndarray:
        """The script's next tokens after each of ``ids`` (whatever they are), as consecutive decode steps of each
        row."""
        script, marks = self.script, kv.keys[0]
        count, new = ids.shape
        script.steps.append(f"check:{new}" if count == 1 else f"checks:{count}x{new}")
        logits = np.zeros((count, new, VOCAB), dtype=np.float32)
        for row in range(count):
            start = int(past[row])
            for position in range(new):
                chosen = int(marks[first + row, 0, start + position - 1, 0]) + 1
                marks[first + row, 0, start + position, 0] = chosen
                kv.values[0][first + row, 0, start + position, 0] = ids[row, position] + 1
                logits[row, position, script.tokens[chosen % len(script.tokens)]] = SCRIPTED_LOGIT
        return logits if every_position else logits[:, -1]


def prompt_logits(ids: np.ndarray, last: np.ndarray) -> np.ndarray:
    """The fake's logits after each token of a prompt chunk: the chunk's next token scores ``SCRIPTED_LOGIT`` (so
    the prompt's log-probabilities are all but 0), and after its last token, the scripted first token does."""
    every = np.zeros((len(ids), VOCAB), dtype=np.float32)
    every[np.arange(len(ids) - 1), ids[1:]] = SCRIPTED_LOGIT
    every[-1] = last
    return every


class FakeGuide:
    """A grammar that allows everything."""

    failed = None

    def mask(self, logits: np.ndarray) -> None:
        pass

    def consume(self, token: int) -> None:
        pass


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
                 has_chat_template: bool = True, rope_switch: int | None = None,
                 fim_tokens: tuple[int, int, int] | None = None, think_markers: tuple[str, str] | None = None,
                 chat_template: str = "", think_token_ids: tuple[int, int] | None = None,
                 prompt_prefix: tuple[int, ...] = (), row_wise: bool = False,
                 multi_token_rows: bool = False) -> None:
        self.script = script
        self.pieces = pieces
        self.rope_switch = rope_switch  # LongRoPE's original length, as the graph would say
        self.row_wise = row_wise  # its graph computes a row's tokens as one-token steps would (as phi-api's operators)
        self.multi_token_rows = multi_token_rows  # its attention takes several new tokens a row (as phi-api's)
        self.info = ModelInfo(
            path="/fake", model_type="fake", context_length=context_length, vocab_size=VOCAB,
            eos_token_ids=frozenset({EOS}), has_chat_template=has_chat_template, fingerprint="fp_fake",
            fim_tokens=fim_tokens, think_markers=think_markers, chat_template=chat_template,
            think_token_ids=think_token_ids, prompt_prefix=prompt_prefix,
        )
        self.spec = FakeDecoder(script, rope_switch, row_wise, multi_token_rows).spec
        self.identity = "fake model"
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

    def render_chat(self, messages: list[dict[str, Any]], tools: Any = None, add_generation_prompt: bool = True,
                    variables: dict[str, Any] | None = None) -> str:
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages)
        text += "".join(f"<{name}={value}>" for name, value in (variables or {}).items())
        text += "<assistant>" if add_generation_prompt else ""
        self.rendered.append(text)
        return text

    def new_decoder(self, threads: int) -> FakeDecoder:
        self.script.decoder_threads.append(threads)
        return FakeDecoder(self.script, self.rope_switch, self.row_wise, self.multi_token_rows)

    def guide(self, grammar: tuple[str, str]) -> FakeGuide:
        self.script.grammars.append(grammar)
        return FakeGuide()

    def create_stream(self) -> FakeStream:
        return FakeStream(self.pieces)


class RecordingEngine(Engine):
    """The real engine, noting every choice's parameters in its model's script, on the script's clock, with the
    batch's invariants checked after every iteration."""

    def __init__(self, model: FakeModel, draft: FakeModel | None = None, **options: Any) -> None:
        """``options``: :class:`EngineConfig`'s fields; ``draft``: a draft model."""
        super().__init__(model, EngineConfig(clock=model.script.clock, checked=True, **options), draft=draft)

    def submit_prompts(self, prompts: list[np.ndarray], params: list[Any], request_id: str = "-",
                       priority: int = 0, cache_key: str = "") -> Any:
        self.model.script.params.extend(params)
        self.model.script.prompts.extend(prompt.tolist() for prompt in prompts)
        self.model.script.priorities.append(priority)
        self.model.script.cache_keys.append(cache_key)
        return super().submit_prompts(prompts, params, request_id, priority, cache_key)


def text_pieces(*pieces: bytes) -> dict[int, bytes]:
    """Token ids 1..n for the given byte pieces (0 is EOS)."""
    return {index + 1: piece for index, piece in enumerate(pieces)}


def fake_engine(tokens: list[int], pieces: dict[int, bytes], *, timeout: float = 60.0, prefill_chunk: int = 8,
                prefix_cache: str = "off", gate: threading.Semaphore | None = None, fail_at: int | None = None,
                kv_budget_bytes: int = 1 << 20, max_rows: int = 64, draft_max: int = 0, batch_invariant: bool = False,
                tool_parser: str = "auto", reasoning_parser: str = "auto", history_tokens: int = 0,
                draft: FakeModel | None = None, **model_options: Any) -> RecordingEngine:
    """An Engine over a FakeModel running ``tokens`` (no drafts unless ``draft_max``; no key's history drafts
    unless ``history_tokens``; ``draft``: a draft model)."""
    model = FakeModel(Script(tokens, gate=gate, fail_at=fail_at), pieces, **model_options)
    return RecordingEngine(model, draft, prefill_chunk=prefill_chunk, timeout=timeout, prefix_cache=prefix_cache,
                           kv_budget_bytes=kv_budget_bytes, max_rows=max_rows, draft_max=draft_max,
                           batch_invariant=batch_invariant, tool_parser=tool_parser,
                           reasoning_parser=reasoning_parser, history_tokens=history_tokens)

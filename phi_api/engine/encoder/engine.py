"""An encoder model's face to the service, as :class:`phi_api.engine.Engine` is a generator's: its facts, its
tokenizer (used off the hub, in the worker: never before the fork, whose tokenizer threads a child cannot use), and
this process's encoder thread, which takes requests' inputs and gives back their vectors or scores."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from phi_api.engine.config import EngineConfig
from phi_api.engine.encoder.folder import EncoderInfo
from phi_api.engine.encoder.job import Encoding
from phi_api.engine.encoder.loop import EncoderLoad, EncoderLoop
from phi_api.engine.encoder.tokens import EncoderTokenizer, Tokens
from phi_api.engine.threads.native import off_hub
from phi_api.engine.threads.wakeup import HubWaker


class Encoded:
    """The request side of submitted inputs: wait for their results, or stop them."""

    def __init__(self, job: Encoding, waker: HubWaker) -> None:
        self.job, self._waker = job, waker

    def wait(self, timeout: float | None) -> bool:
        """Sleep (this greenlet) until the inputs are done or ``timeout`` passes; whether they are done."""
        if not self.job.ended:
            self._waker.wait(timeout)
        return self.job.ended

    def close(self) -> None:
        """Done with it: what still waits is dropped (idempotent)."""
        self.job.cancel()
        self._waker.close()


class EncoderEngine:
    """An encoder model and this process's encoder thread."""

    model: Any = None  # no generator's model (nor its key/value spec): the memory books count no rows for it
    waiting_for_memory = False  # it books no key/value memory
    disk_stats = None
    kv_dtype = "none"
    attention_kernel = "onnxruntime"

    def __init__(self, info: EncoderInfo, config: EngineConfig, model_file: Path | None = None) -> None:
        """``model_file``: the graph each worker's session loads (the host's prepacked copy, whose weights the
        workers share: :func:`phi_api.engine.encoder.session.shared_model_file`); default: the folder's own."""
        self.info, self.config = info, config
        self.model_file = model_file or Path(info.path) / "model.onnx"
        self.loop = EncoderLoop(info, config, self.model_file)
        self.observers: list[Callable[..., None]] = []  # a generator's metrics hook: encoders tell theirs elsewhere
        self.draining = False
        self.loaded_at = int(time.time())
        self._tokenizer: EncoderTokenizer | None = None

    @property
    def task(self) -> str:
        """``embed`` or ``rerank``."""
        return self.info.task

    @property
    def folders(self) -> dict[str, int]:
        """The model folder this engine maps, and its files' bytes."""
        return {self.info.path: self.info.size_bytes}

    @property
    def vocab_size(self) -> int:
        return self._tokens().vocab_size

    def texts(self, texts: list[str]) -> list[Tokens]:
        """Each text's tokens (off the hub)."""
        return off_hub(self._tokens().texts, texts)

    def pairs(self, pairs: list[tuple[str, str]], document_tokens: int | None = None) -> list[Tokens]:
        """Each (query, document) pair's tokens (off the hub), each document cut to ``document_tokens``."""
        return off_hub(self._tokens().pairs, pairs, self.info.context_length, document_tokens)

    def token_ids(self, ids: list[int]) -> Tokens:
        """Ids a client gave, as they are."""
        return self._tokens().ids(ids)

    def submit(self, inputs: list[Tokens], priority: int = 0, request_id: str = "-") -> Encoded:
        """Encode ``inputs`` at ``priority`` (lower is sooner), batched with the worker's other requests."""
        waker = HubWaker()
        job = Encoding(inputs, priority=priority, request_id=request_id, timeout=self.config.timeout,
                       notify=waker.notify)
        try:
            self.loop.submit(job)
        except BaseException:
            waker.close()
            raise
        return Encoded(job, waker)

    def _tokens(self) -> EncoderTokenizer:
        """The tokenizer, parsed on a pooled thread at its first use in this process: parsing ``tokenizer.json``
        takes tens of milliseconds, which on the hub would stall every stream of the worker."""
        if self._tokenizer is None:
            made = off_hub(EncoderTokenizer, self.info.path)
            self._tokenizer = self._tokenizer or made  # another greenlet may have made it meanwhile
        return self._tokenizer

    @property
    def worker_bytes(self) -> int:
        """What the encoder holds in each worker at most: one call's activations (``ENCODER_BATCH_TOKENS`` tokens'
        hidden and feed-forward vectors, and their attention scores over inputs of the model's length), and, unless
        the workers share a prepacked copy of the weights, its session's own copy of them."""
        tokens, info = self.config.encoder_batch_tokens, self.info
        longest = min(info.context_length, tokens)
        hidden, heads, inner = info.shape
        own = info.size_bytes if self.model_file == Path(info.path) / "model.onnx" else 0
        return own + 4 * tokens * (4 * hidden + 2 * inner + heads * longest)

    @property
    def load(self) -> EncoderLoad:
        return self.loop.load

    @property
    def ready(self) -> bool:
        return self.loop.running and not self.draining

    def start(self) -> None:
        self.loop.start()

    def stop(self) -> None:
        self.loop.stop()

    def retire(self) -> None:
        self.draining = True
        self.loop.retire()

    def end_all(self, reason: str) -> None:
        """Nothing to end early: an encoder's batches take a fraction of a second, done before the worker exits."""

    def report_disk(self) -> None:
        """An encoder keeps nothing on disk."""

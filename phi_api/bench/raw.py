"""The reference: ONNX Runtime GenAI's own Python API, in this process, on the same model."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from phi_api.bench.common import PROMPT, median


@dataclass(frozen=True)
class RawResult:
    """One generation run directly on the engine."""

    prefill_seconds: float  # prompt in -> first token out
    tokens: int
    decode_seconds: float

    @property
    def decode_rate(self) -> float:
        return (self.tokens - 1) / self.decode_seconds


class RawEngine:
    """``onnxruntime_genai.Generator`` in a tight loop, with the server's thread settings."""

    def __init__(self, model_path: str, threads: int | None = None) -> None:
        import onnxruntime_genai as og

        self._og = og
        config = og.Config(model_path)
        threads = threads or os.cpu_count() or 1
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {
            "intra_op_num_threads": threads, "inter_op_num_threads": 1}}}}))
        self._model = og.Model(config)
        self._tokenizer = og.Tokenizer(self._model)

    def encode(self, text: str):
        return self._tokenizer.encode(text)

    def generate(self, prompt: str, max_tokens: int) -> RawResult:
        """Greedy, end-of-sequence ignored, exactly ``max_tokens`` tokens."""
        return self._run(prompt, max_tokens, 1)

    def generate_batch(self, prompt: str, max_tokens: int, batch: int) -> float:
        """Aggregate decode tokens/s of one static batch of ``batch`` copies of ``prompt`` (greedy, no EOS).

        The engine's own batching: every sequence starts together and the batch
        admits nothing new until it ends. Identical prompts need no padding.
        """
        result = self._run(prompt, max_tokens, batch)
        return batch * (result.tokens - 1) / result.decode_seconds

    def generate_ids(self, ids: list[int], max_tokens: int) -> RawResult:
        """As :meth:`generate`, for a prompt of token ids."""
        return self._run_ids(np.asarray(ids, dtype=np.int32), max_tokens, 1)

    def decode_ids(self, ids: list[int], max_tokens: int, batch: int) -> float:
        """Aggregate decode tokens/s of ``batch`` copies of a prompt of token ids (greedy, no EOS)."""
        result = self._run_ids(np.asarray(ids, dtype=np.int32), max_tokens, batch)
        return batch * (result.tokens - 1) / result.decode_seconds

    def _run(self, prompt: str, max_tokens: int, batch: int) -> RawResult:
        """``batch`` copies of ``prompt``, timed per step (each token counted once per sequence)."""
        return self._run_ids(np.asarray(self._tokenizer.encode(prompt), dtype=np.int32), max_tokens, batch)

    def _run_ids(self, ids: np.ndarray, max_tokens: int, batch: int) -> RawResult:
        og = self._og
        params = og.GeneratorParams(self._model)
        length = len(ids) + max_tokens
        params.set_search_options(max_length=length, min_length=length, do_sample=False, batch_size=batch)
        generator = og.Generator(self._model, params)
        started = time.perf_counter()
        generator.append_tokens(np.tile(ids, (batch, 1)) if batch > 1 else ids)
        generator.generate_next_token()
        first = time.perf_counter()
        tokens = 1
        while not generator.is_done() and tokens < max_tokens:
            generator.generate_next_token()
            tokens += 1
        return RawResult(first - started, tokens, time.perf_counter() - first)


class EngineBatch:
    """phi-api's own engine graph session, in this process: a static batch of identical rows, greedy.

    The ceiling of the server's batching on this machine: one decoder step
    over ``rows`` rows per token, with no HTTP, no scheduler and no sampling
    beyond an argmax. It uses the decoder graph the server does: the host's prepacked model, with int8 keys and
    values where ``kv_dtype`` (the server's ``KV_CACHE_DTYPE``) picks them.
    """

    def __init__(self, model_path: str, threads: int | None = None, kv_dtype: str = "auto") -> None:
        from phi_api.engine.runtime.model import LanguageModel
        from phi_api.settings import cache_root

        model = LanguageModel(model_path, cache_dir=cache_root() / "runtime", kv_dtype=kv_dtype)
        self._decoder = model.new_decoder(threads or os.cpu_count() or 1)

    def aggregate_rate(self, prompt: np.ndarray, max_tokens: int, rows: int) -> float:
        """Aggregate decode tokens/s of ``rows`` copies of ``prompt`` advanced together for ``max_tokens``."""
        from phi_api.engine.runtime.pool import KVPool

        kv = KVPool(self._decoder.spec, rows, len(prompt) + max_tokens)
        tokens = np.zeros((rows, 1), dtype=np.int64)
        for row in range(rows):
            logits = self._decoder.step(kv, row, np.asarray(prompt, dtype=np.int64)[None, :], np.array([0]), True)
            tokens[row, 0] = int(np.argmax(logits[0]))
        past = np.full(rows, len(prompt), dtype=np.int64)
        started = time.perf_counter()
        for _ in range(max_tokens - 1):
            logits = self._decoder.step(kv, 0, tokens, past, False)
            tokens[:, 0] = np.argmax(logits, axis=1)
            past += 1
        rate = rows * (max_tokens - 1) / (time.perf_counter() - started)
        self._decoder.unbind()
        kv.close()
        return rate


class RawReference:
    """ONNX Runtime GenAI itself, in this process: with every core (set explicitly: its default computed on
    one core here), and with one thread; and phi-api's own engine session, for its static-batch ceiling."""

    def __init__(self, model_path: str) -> None:
        self.engines = {os.cpu_count() or 1: RawEngine(model_path), 1: RawEngine(model_path, 1)}
        self.prompt_tokens = len(self.engines[1].encode(PROMPT))
        for engine in self.engines.values():
            engine.generate(PROMPT, 8)  # warm-up
        self.own = EngineBatch(model_path)

    def static_batch(self, batch: int, max_tokens: int, runs: int) -> dict[str, Any]:
        """Static batches of ``batch`` copies of the prompt with every core, interleaved with single streams:
        ONNX Runtime GenAI's own batching, and phi-api's engine session without the server around it."""
        threads = max(self.engines)
        engine = self.engines[threads]
        prompt = np.asarray(engine.encode(PROMPT))
        raw, own, single = [], [], []
        for _ in range(runs):
            single.append(engine.generate(PROMPT, max_tokens).decode_rate)
            raw.append(engine.generate_batch(PROMPT, max_tokens, batch))
            own.append(self.own.aggregate_rate(prompt, max_tokens, batch))
        return {"batch": batch, "threads": threads, "aggregate_tokens_per_s": median(raw),
                "engine_aggregate_tokens_per_s": median(own), "single_tokens_per_s": median(single),
                "ratio": median(raw) / median(single), "engine_ratio": median(own) / median(single)}

    def sample(self, prompt: str, max_tokens: int) -> dict[int, Any]:
        """One generation per thread setting."""
        return {threads: engine.generate(prompt, max_tokens) for threads, engine in self.engines.items()}

    def engine_batch(self, rows: int, max_tokens: int) -> float:
        """phi-api's engine session alone (no server), a static batch of ``rows``: the ceiling of batching."""
        return self.own.aggregate_rate(np.asarray(self.engines[1].encode(PROMPT)), max_tokens, rows)


def summarize_raw(samples: list[dict[int, Any]]) -> dict[str, Any]:
    """Medians of raw-engine samples, per thread setting."""
    return {
        f"{threads}_threads": {
            "ttft_s": median([sample[threads].prefill_seconds for sample in samples]),
            "decode_tokens_per_s": median([sample[threads].decode_rate for sample in samples]),
        }
        for threads in samples[0]
    }

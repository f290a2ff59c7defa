"""What one generation is asked to do, in engine terms."""

from __future__ import annotations

from dataclasses import dataclass, field

# The engine's random_seed is a non-negative int32; OpenAI seeds are any integer.
_SEED_MODULUS = 2**31 - 1


@dataclass(frozen=True)
class SamplingParams:
    """Sampling and stopping rules for one generation (already validated)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = field(default=())
    min_tokens: int = 0
    ignore_eos: bool = False
    min_p: float = 0.0
    logprobs: int | None = None  # alternatives per token to report; None: no log-probabilities
    guidance: tuple[str, str] | None = None  # (kind, grammar): "json_schema", "regex" or "lark_grammar"

    @property
    def greedy(self) -> bool:
        """Temperature 0 (or top-k 1) means: always the most likely token."""
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def edits_logits(self) -> bool:
        """Whether each step's logits must pass through our own processing (it costs a copy each way)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias
                    or (self.min_p and not self.greedy) or self.logprobs is not None)

    @property
    def reuse_key(self) -> tuple | None:
        """What a kept generator's search options must equal for this request to reuse it; None: never.

        A seeded sampling request must start from a freshly seeded generator,
        and a minimum length is fixed per generator, so those never reuse.
        """
        if (self.seed is not None and not self.greedy) or self.ignore_eos or self.min_tokens or self.guidance:
            return None
        if self.greedy:
            return ("greedy", self.repetition_penalty)
        return ("sample", self.temperature, self.top_p, self.top_k, self.repetition_penalty)

    def search_options(self, prompt_tokens: int, capacity: int | None = None) -> dict[str, float | bool]:
        """ONNX Runtime GenAI search options for a prompt of ``prompt_tokens`` tokens.

        ``capacity`` (the KV buffer, in tokens) defaults to exactly prompt plus
        ``max_tokens``; we stop at ``max_tokens`` ourselves either way. Every
        option is set explicitly: a model folder's ``genai_config.json`` carries
        its own defaults (top_k 50, for one) that an OpenAI request must not inherit.
        """
        max_length = prompt_tokens + self.max_tokens
        options: dict[str, float | bool] = {
            "max_length": capacity or max_length,
            "do_sample": not self.greedy,
            "temperature": self.temperature if not self.greedy else 1.0,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "repetition_penalty": self.repetition_penalty,
        }
        if self.seed is not None:
            options["random_seed"] = self.seed % _SEED_MODULUS
        if self.ignore_eos:
            options["min_length"] = max_length
        elif self.min_tokens:
            options["min_length"] = prompt_tokens + self.min_tokens
        return options

"""What one generation is asked to do, in engine terms."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ThinkingBudget:
    """A reasoning model's thinking, ended after ``tokens`` tokens: its end marker is then the only choice."""

    start: int  # the start marker's token id
    end: int  # the end marker's token id
    tokens: int
    inside: bool = False  # the prompt opened the thinking (the answer starts in it)


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
    prompt_logprobs: int | None = None  # the same for every prompt token (echo); None: none
    guidance: tuple[str, str] | None = None  # (kind, grammar): "json_schema" or "llguidance" (a definition)
    draft_max: int | None = None  # prompt-lookup draft tokens a step may verify; None: the server's setting
    draft_min: int = 0  # fewest draft tokens worth a check (shorter drafts are not checked)
    prediction: tuple[int, ...] = ()  # the answer the request expects (OpenAI's predicted outputs), drafted first;
    # the engine takes it as an index (engine.choice.Choice.prediction), built off the hub at submission
    penalty_window: int | None = None  # the repetition penalty looks at the last this many tokens; None: all
    thinking: ThinkingBudget | None = None  # a thinking budget; None: the model thinks as long as it likes

    @property
    def greedy(self) -> bool:
        """Temperature 0 (or top-k 1) means: always the most likely token."""
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def edits_logits(self) -> bool:
        """Whether each step's logits need edits of their own (each costs a pass over the vocabulary)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias
                    or self.repetition_penalty != 1.0 or (self.min_p and not self.greedy)
                    or self.logprobs is not None)

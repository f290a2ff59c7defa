"""The inference engine, no Flask and no HTTP: its face to the service is :mod:`.facade` (an :class:`Engine` per
model, a :class:`Generation` per request); below it, rooms that each import only the rooms beneath them:

- :mod:`.encoder`: encoder models (embeddings, rerankers): their folder, tokenizer, session and thread;
- :mod:`.sched`: the engine thread's loop, its continuous batch, the scheduling decisions, drafts' checks;
- :mod:`.kv`: the rows of keys and values, the budget's books, prefix reuse, prompts on disk, the sequences;
- :mod:`.runtime`: a model folder, the loaded model, the decoder session and its buffers, the graph's rewrites;
- :mod:`.choice`: what the request side and the engine thread share of a choice, and the events it tells;
- :mod:`.sampling`: choosing tokens, grammar masks, tokens to text, drafts from the prompt;
- :mod:`.kernels`, :mod:`.threads`, and what a generation asks (:mod:`.params`) and an engine is (:mod:`.config`).
"""

from phi_api.engine.choice import Event, Finished, PromptLogprobs, TextDelta
from phi_api.engine.config import EngineConfig
from phi_api.engine.encoder.engine import Encoded, EncoderEngine
from phi_api.engine.encoder.folder import EncoderInfo, is_encoder_folder
from phi_api.engine.encoder.tokens import Tokens
from phi_api.engine.facade import Engine, Generation
from phi_api.engine.kv.budget import SharedBudget
from phi_api.engine.params import SamplingParams, ThinkingBudget
from phi_api.engine.runtime.model import ModelInfo
from phi_api.engine.sched.loop import EngineLoad
from phi_api.errors import CapacityError, ChatTemplateError, RetiredError

ServedEngine = Engine | EncoderEngine  # what serves a model: a generator's engine or an encoder's

__all__ = [
    "CapacityError",
    "ChatTemplateError",
    "Encoded",
    "EncoderEngine",
    "EncoderInfo",
    "Engine",
    "EngineConfig",
    "EngineLoad",
    "Event",
    "Finished",
    "Generation",
    "ModelInfo",
    "PromptLogprobs",
    "RetiredError",
    "SamplingParams",
    "ServedEngine",
    "SharedBudget",
    "TextDelta",
    "ThinkingBudget",
    "Tokens",
    "is_encoder_folder",
]

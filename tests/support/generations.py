"""Running generations on an engine (the real engine loop and batch, fake model) to the end, for the engine's tests."""

from __future__ import annotations

from typing import Any

import numpy as np

from phi_api.engine import Engine, Finished, Generation, SamplingParams, TextDelta


def collect(generation: Generation) -> tuple[str, Finished]:
    """The text and the end of a (single-choice) generation; closes it."""
    text, finished = [], None
    for event in generation.events():
        if isinstance(event, TextDelta):
            text.append(event.text)
        elif isinstance(event, Finished):
            finished = event
    generation.close()
    return "".join(text), finished


def generate(engine: Engine, prompt: Any, **params: Any) -> tuple[str, Finished]:
    """Generate from token ids ``prompt`` with these sampling parameters, to the end."""
    return collect(engine.submit(np.asarray(prompt, dtype=np.int32), SamplingParams(**params)))

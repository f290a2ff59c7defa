"""ONNX Runtime GenAI's model builder, run on configs of transformers 5 that it cannot read yet.

transformers 5 keeps a model's rotary settings per kind of layer (Gemma 3:
``rope_parameters = {"full_attention": {...}, "sliding_attention": {...}}``),
and loading a config rebuilds that shape from any older field; the builder
of onnxruntime-genai 0.18 reads one flat ``rope_parameters`` and
``rope_local_base_freq`` for the sliding layers (``KeyError: 'rope_type'``
otherwise). Run as ``python -m phi_api.tools.builder_shim BUILDER-ARGS``,
this module gives the builder the flat shape as the config is loaded, then
runs the builder as its own command. Configs of one kind of layer pass
unchanged.
"""

from __future__ import annotations

import runpy
import sys
from typing import Any


def flatten_rope(config: Any) -> Any:
    """``config`` with per-layer-kind rotary settings made flat, the full attention's first (as the builder reads
    them); others as they are."""
    found = getattr(config, "rope_parameters", None)
    if isinstance(found, dict) and isinstance(found.get("full_attention"), dict):
        local = found.get("sliding_attention")
        if isinstance(local, dict) and "rope_theta" in local:
            config.rope_local_base_freq = local["rope_theta"]
        config.rope_parameters = dict(found["full_attention"])
        config.rope_theta = found["full_attention"].get("rope_theta")
    return config


def main() -> None:
    import transformers

    load = transformers.AutoConfig.from_pretrained

    def flat_config(*args: Any, **kwargs: Any) -> Any:
        return flatten_rope(load(*args, **kwargs))

    transformers.AutoConfig.from_pretrained = flat_config  # type: ignore[method-assign]
    sys.argv = ["onnxruntime_genai.models.builder", *sys.argv[1:]]
    runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__")


if __name__ == "__main__":
    main()

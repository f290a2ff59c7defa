"""The model builder's shim: transformers 5's rotary settings per kind of layer, made flat as the builder reads them."""

from __future__ import annotations

from types import SimpleNamespace

from phi_api.tools.builder_shim import flatten_rope


def test_gemma_3_s_rotary_settings_per_kind_of_layer_are_made_flat():
    config = SimpleNamespace(rope_parameters={"full_attention": {"rope_theta": 1e6, "rope_type": "default"},
                                              "sliding_attention": {"rope_theta": 1e4, "rope_type": "default"}})
    flat = flatten_rope(config)
    assert flat.rope_parameters == {"rope_theta": 1e6, "rope_type": "default"}
    assert flat.rope_theta == 1e6 and flat.rope_local_base_freq == 1e4


def test_a_config_of_one_kind_of_layer_passes_unchanged():
    llama = SimpleNamespace(rope_parameters={"rope_theta": 1e5, "rope_type": "default"}, rope_theta=1e5)
    assert flatten_rope(llama).rope_parameters == {"rope_theta": 1e5, "rope_type": "default"}
    assert not hasattr(llama, "rope_local_base_freq")
    bare = SimpleNamespace()
    assert flatten_rope(bare) is bare and not vars(bare)

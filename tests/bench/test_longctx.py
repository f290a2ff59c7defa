"""``bench long``'s server: one token a step unless told otherwise (its decode figures are shares of the bandwidth
one token a step can use; the raw engine beside it drafts nothing)."""

from __future__ import annotations

from phi_api.bench.longctx import server_settings


def test_the_server_drafts_nothing_unless_a_setting_says_so():
    assert server_settings([]) == {"SPECULATIVE_DRAFT_MAX": "0"}
    assert server_settings(["KV_CACHE_DTYPE=int4"]) == {"SPECULATIVE_DRAFT_MAX": "0", "KV_CACHE_DTYPE": "int4"}
    assert server_settings(["SPECULATIVE_DRAFT_MAX=8"])["SPECULATIVE_DRAFT_MAX"] == "8"

"""The mixed load's requests and its verdict (the load itself runs against real servers: see docs/memory.md)."""

from __future__ import annotations

import json
import os

from phi_api.bench.mixed import KINDS, body, report, tree_pss


def test_every_kind_is_a_streamed_chat_and_long_prompts_are_long():
    bodies = {kind: body(kind, 3, "m") for kind in KINDS}
    assert all(made["stream"] and made["model"] == "m" for made in bodies.values())
    assert bodies["n3"]["n"] == 3
    assert len(bodies["long"]["messages"][0]["content"]) > 4 * len(bodies["conversation"]["messages"][1]["content"]) / 2
    assert body("long", 3, "m") != body("long", 4, "m")  # every prompt is new


def test_the_tree_s_pss_counts_this_process():
    assert tree_pss(os.getpid()) > 10 * 2**20


def test_the_verdict_fails_on_a_5xx_a_timeout_or_memory_past_the_limit(capsys):
    good = {"requests": {"200": 10, "abandoned": 2}, "generations_ended_by_timeout": 0, "peak_pss_mb": 900,
            "memory_limit_mb": 1000, "longest_first_token_seconds": {}}
    assert report(good)
    assert not report({**good, "requests": {"200": 9, "503": 1}})
    assert not report({**good, "generations_ended_by_timeout": 1})
    assert not report({**good, "peak_pss_mb": 1001})
    assert '"peak_pss_mb": 900' in capsys.readouterr().out


def test_the_report_is_written_where_asked(tmp_path):
    good = {"requests": {"200": 3}, "generations_ended_by_timeout": 0, "peak_pss_mb": 10, "memory_limit_mb": None,
            "longest_first_token_seconds": {}}
    out = tmp_path / "mixed.json"
    assert report(good, str(out))
    assert json.loads(out.read_text(encoding="utf-8")) == good

"""phi-api bench turns: its table, and a baseline that must be another checkout."""

from __future__ import annotations

import argparse

import pytest

from phi_api.bench.server import REPO, Server
from phi_api.bench.turns import main, table


def test_the_table_gives_each_request_s_first_token_against_the_baseline_s():
    def case(ttft: float, cached: int) -> dict:
        return {"ttft_s": ttft, "cached_tokens": [cached], "prompt_tokens": [267]}

    report = {"ours": {"cold": case(0.2, 0), "again": case(0.02, 266), "next_turn": case(0.03, 274)},
              "baseline": {"cold": case(0.2, 0), "again": case(0.04, 256), "next_turn": case(0.03, 274)}}
    assert table(report).splitlines()[3] == "| again | 0.020 s | 0.040 s | 0.50x | 266 / 256 of 267 |"


def test_the_baseline_is_another_checkout():
    with pytest.raises(SystemExit, match="another one"):
        main(argparse.Namespace(model_path="unused", baseline_repo=REPO, runs=1, words=10, out=""))


def test_a_server_of_another_checkout_runs_its_code(tmp_path):
    other = Server(tmp_path, repo=tmp_path / "checkout")
    mine = Server(tmp_path)
    assert other.repo == tmp_path / "checkout" and other.env["PYTHONPATH"] == str(tmp_path / "checkout")
    assert mine.repo == REPO and mine.env.get("PYTHONPATH") != str(tmp_path / "checkout")

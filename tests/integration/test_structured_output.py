"""Forced tool calls and json_schema answers on the default model come out whole and valid (greedy, over the fixed
set of ``tests/data/structured-cases.json``; ``python -m phi_api bench structured`` prints the same figures).

Measured on a 2-core Zen 4 (docs/quality.md): 24 of 24 forced calls (21 before the tool instructions showed a
concrete call; 16 with the int4 recipe; 23 with BATCH_INVARIANT, whose lone rows are computed as a pair, with
other last bits) and 18 of 24 json_schema answers (11 with the int4 recipe). The bounds leave one case of margin:
other CPUs' kernels give other last bits, and a greedy near-tie may go the other way.
"""

from __future__ import annotations

import pytest

from phi_api.bench import structured
from tests.integration.conftest import MODEL_ID


@pytest.fixture(scope="module")
def report(server):
    return structured.measure(server.url, MODEL_ID, structured.read_cases())


def test_forced_tool_calls_finish_with_valid_arguments(report):
    assert report["tools"]["cases"] >= 20
    # counted, not the share: the report rounds it (23 of 24 reads 0.958, below 23 / 24)
    assert len(report["tools"]["failed"]) <= 1, report["tools"]["failed"]


def test_json_schema_answers_finish_valid(report):
    assert report["schemas"]["cases"] >= 20
    assert len(report["schemas"]["failed"]) <= report["schemas"]["cases"] - 17, report["schemas"]["failed"]

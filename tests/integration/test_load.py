"""A bounded burst far beyond the concurrency limit: only 200s and 429s, and every slot comes back.

The same code as ``python -m phi_api bench load`` (which also soaks, outside the suite).
"""

from __future__ import annotations

from phi_api.bench.load import burst, free_slots
from tests.integration.conftest import MODEL_ID


def test_a_burst_sixteen_times_the_limit_gets_only_200_and_429(limited_server):
    result = burst(limited_server.url, MODEL_ID, count=32, max_tokens=8)
    print(f"burst of 32 against a limit of 2: {dict(result.outcomes)} in {result.seconds:.1f}s")
    assert set(result.outcomes) == {"200", "429"}  # no 5xx, no dropped connection, no hang, no malformed answer
    assert result.outcomes["200"] >= 2
    assert free_slots(limited_server.url, MODEL_ID, 2, timeout=10)

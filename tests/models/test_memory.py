"""The server's memory budget in a worker (models.memory): its own memory measured again as it serves."""

from __future__ import annotations

import pytest

from phi_api.engine.kv.budget import SharedBudget
from phi_api.models import memory
from phi_api.models.memory import ServerMemory

MB = 2**20


@pytest.fixture
def measured(monkeypatch):
    """What the worker's private memory reads as next (set it in the test)."""
    now = {"bytes": 0}
    monkeypatch.setattr(memory, "measured_here", lambda: now["bytes"])
    return now


def test_a_worker_s_own_memory_is_measured_again_and_its_largest_figure_shrinks_the_key_value_share(measured):
    server = ServerMemory(limit=1000 * MB, workers=2, master_private=100 * MB, shared=SharedBudget(0))
    server.observe(loaded=True, ready=False, weights=200 * MB)  # not ready: the master's figure stands in
    assert server.shared.budget == (1000 - 200 - 100 - 2 * 100) * MB // 2
    measured["bytes"] = 150 * MB
    server.observe(loaded=True, ready=True, weights=200 * MB)
    assert server.worker_private == 150 * MB and server.shared.budget == (1000 - 200 - 100 - 300) * MB // 2
    measured["bytes"] = 180 * MB  # an arena grew under load
    server.observe(loaded=True, ready=True, weights=200 * MB)
    assert server.worker_private == 180 * MB and server.shared.budget == (1000 - 200 - 100 - 360) * MB // 2
    measured["bytes"] = 160 * MB  # a figure below the largest one does not give the room back
    server.observe(loaded=True, ready=True, weights=200 * MB)
    assert server.worker_private == 180 * MB


def test_what_the_key_value_books_hold_is_not_counted_as_the_worker_s_own(measured):
    shared = SharedBudget(0)
    server = ServerMemory(limit=1000 * MB, workers=1, master_private=50 * MB, shared=shared)
    measured["bytes"] = 100 * MB
    server.observe(loaded=True, ready=True, weights=0)
    shared.staged = 300 * MB  # keys and values held (here: copies on their way to disk) make the process larger
    measured["bytes"] = 420 * MB
    server.observe(loaded=True, ready=True, weights=0)
    assert server.worker_private == 120 * MB
    assert shared.budget == (1000 - 50 - 120) * MB


def test_a_model_loaded_or_unloaded_starts_the_largest_figure_again(measured):
    server = ServerMemory(limit=1000 * MB, workers=1, master_private=50 * MB, shared=SharedBudget(0))
    measured["bytes"] = 100 * MB
    server.observe(loaded=True, ready=True, weights=200 * MB)
    measured["bytes"] = 180 * MB  # a second model's sessions
    server.observe(loaded=True, ready=True, weights=300 * MB)
    assert server.worker_private == 180 * MB
    measured["bytes"] = 110 * MB  # unloaded, its memory given back
    server.observe(loaded=True, ready=True, weights=200 * MB)
    assert server.worker_private == 110 * MB and server.shared.budget == (1000 - 200 - 50 - 110) * MB

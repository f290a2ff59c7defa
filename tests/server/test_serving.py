"""The gunicorn hooks of ``phi_api.server.serving``, called as gunicorn calls them, without a server."""

from __future__ import annotations

import gc
import os
from types import SimpleNamespace

import pytest

from phi_api.server import serving


class Exited(Exception):
    """What the patched ``os._exit`` raises instead of ending the test process."""


@pytest.fixture
def exits(monkeypatch):
    codes: list[int] = []

    def fake_exit(code: int) -> None:
        codes.append(code)
        raise Exited(code)

    monkeypatch.setattr(os, "_exit", fake_exit)
    return codes


def test_worker_exit_in_the_master_for_a_vanished_worker_leaves_the_master_running(exits, monkeypatch):
    # gunicorn's Arbiter.kill_worker calls worker_exit in the master when os.kill finds no such process, here
    # while it halts on SIGTERM (inside its `except StopIteration`): the master must go on with its shutdown.
    dead = []
    monkeypatch.setattr("phi_api.telemetry.metrics.mark_worker_dead", dead.append)
    worker = SimpleNamespace(pid=os.getpid() + 1, wsgi=None)
    try:
        raise StopIteration
    except StopIteration:
        serving.worker_exit(SimpleNamespace(), worker)
    assert exits == []
    assert dead == [worker.pid]  # its live gauges are dropped, as child_exit does for a reaped one


@pytest.mark.parametrize("raised,code", [(None, 0), (SystemExit(3), 3), (RuntimeError("boom"), 1)])
def test_worker_exit_in_the_worker_leaves_with_its_status(exits, raised, code):
    worker = SimpleNamespace(pid=os.getpid(), wsgi=None)
    with pytest.raises(Exited):
        if raised is None:
            serving.worker_exit(SimpleNamespace(), worker)
        else:
            try:
                raise raised
            except BaseException:
                serving.worker_exit(SimpleNamespace(), worker)
    assert exits == [code]


def test_what_the_master_loaded_leaves_the_collectors_view_before_a_fork():
    loaded = [object()]  # stands for the app and the model the master loaded
    try:
        serving.pre_fork(SimpleNamespace(), SimpleNamespace())
        assert not any(each is loaded for each in gc.get_objects())  # no collection walks (or writes to) it
    finally:
        gc.unfreeze()

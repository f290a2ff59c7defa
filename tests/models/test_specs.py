"""Model specs: a pull at start-up says how far it is."""

from __future__ import annotations

import logging

from phi_api.models.specs import PullProgress


def test_a_pull_at_start_up_logs_its_progress_at_most_every_so_often(caplog):
    progress = PullProgress("phi-3.5-mini", every=0.0)
    with caplog.at_level(logging.INFO, logger="phi_api.models.specs"):
        progress({"status": "pulling manifest"})
        progress({"status": "pulling 0123", "digest": "sha256:0123", "total": 200 * 2**20, "completed": 50 * 2**20})
    assert [record.getMessage() for record in caplog.records] == ["pulling phi-3.5-mini: 50 of 200 MB (25%)"]
    quiet = PullProgress("phi-3.5-mini", every=3600.0)
    with caplog.at_level(logging.INFO, logger="phi_api.models.specs"):
        quiet({"total": 10, "completed": 5})
    assert len(caplog.records) == 1

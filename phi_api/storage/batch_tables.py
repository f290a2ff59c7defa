"""The Batch API's tables, in the files' metadata (one schema, one migration): batches, their lines, and each key's
turn at the runners."""

from __future__ import annotations

import sqlalchemy as sa

from phi_api.storage.database import owner_column
from phi_api.storage.files import TABLES

BATCHES = sa.Table("batches", TABLES, sa.Column("id", sa.String(64), primary_key=True),
                   sa.Column("object", sa.Text), sa.Column("created_at", sa.Float),
                   owner_column(),
                   sa.Column("held", sa.BigInteger))  # bytes its lines' answers hold until its output is written
LINES = sa.Table("lines", TABLES, sa.Column("batch_id", sa.String(64), primary_key=True),
                 sa.Column("line", sa.Integer, primary_key=True), sa.Column("custom_id", sa.Text),
                 sa.Column("body", sa.Text),  # an earlier release's copy; now the file's lines hold it
                 sa.Column("state", sa.String(16)),
                 sa.Column("owner", sa.String(255)),  # the worker that claimed it (not the key: see batches.owner)
                 sa.Column("result", sa.Text), sa.Column("ok", sa.Integer), sa.Column("lease_until", sa.Float),
                 sa.Column("file_id", sa.String(64)),  # whose file_lines hold its request
                 sa.Index("pending", "state", "batch_id", "line"))
# Each key's turn at the runners: lines are claimed round robin between keys, and a key whose limits refused a line
# rests until its window opens again.
TURNS = sa.Table("batch_turns", TABLES, sa.Column("owner", sa.String(255), primary_key=True),
                 sa.Column("last_claim", sa.Float), sa.Column("rest_until", sa.Float))

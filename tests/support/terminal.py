"""Reading what a program in a pseudo-terminal shows, for the tests that drive ``phi-api chat``."""

from __future__ import annotations

import os
import select
import time


def read_until(fd: int, ending: bytes, timeout: float = 120) -> bytes:
    """What the terminal shows until it ends with ``ending``."""
    seen, deadline = b"", time.monotonic() + timeout
    while not seen.endswith(ending):
        left = deadline - time.monotonic()
        assert left > 0, f"the terminal never showed {ending!r}; it shows {seen[-500:]!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 4096)
            assert chunk, f"the chat ended early: {seen[-500:]!r}"
            seen += chunk
    return seen

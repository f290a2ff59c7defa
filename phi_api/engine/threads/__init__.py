"""Threads under gevent: real OS threads and locks, and waking a greenlet from the engine thread."""

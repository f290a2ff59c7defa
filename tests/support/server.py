"""The gunicorn launcher the benchmark uses, for the integration tests."""

from phi_api.bench.server import Server, free_port, wait_until

__all__ = ["Server", "free_port", "wait_until"]

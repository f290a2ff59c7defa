"""WSGI entry point in a checkout: ``gunicorn -c gunicorn.conf.py wsgi:app``."""

from phi_api.server.wsgi import app  # noqa: F401

"""WSGI entry point: ``gunicorn -c gunicorn.conf.py wsgi:app``."""

from phi_api.server.serving import build_wsgi_app

app = build_wsgi_app()

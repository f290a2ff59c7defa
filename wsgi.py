"""WSGI entry point: ``gunicorn -c gunicorn.conf.py wsgi:app``."""

from phi_api.serving import build_wsgi_app

app = build_wsgi_app()

"""WSGI entry point of an installed phi-api: ``phi_api.server.wsgi:app`` (``phi-api serve`` runs it)."""

from phi_api.server.serving import build_wsgi_app

app = build_wsgi_app()

"""gunicorn settings for phi-api from a checkout (``gunicorn -c gunicorn.conf.py wsgi:app``): the package's own,
``phi_api/server/gunicorn_config.py``, which ``phi-api serve`` uses installed."""

from phi_api.server.gunicorn_config import *  # noqa: F403

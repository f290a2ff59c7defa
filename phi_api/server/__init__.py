"""Running under gunicorn: the WSGI app and its start-up, the worker class, and the client's connection."""

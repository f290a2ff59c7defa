"""Running under gunicorn: the WSGI app and its start-up failures, the lifecycle hooks and the worker class."""

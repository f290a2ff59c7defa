"""gunicorn settings for phi-api: gevent workers, the model preloaded in the master (PRELOAD_MODEL).

Installed, ``phi-api serve`` runs gunicorn with ``-c python:phi_api.server.gunicorn_config``; in a checkout,
``gunicorn.conf.py`` reads this module. Server settings come from the environment (see the README); any gunicorn
option can still be overridden with GUNICORN_CMD_ARGS or the command line.
"""

# The app is loaded in the master before the workers fork, so gevent must patch
# the standard library before anything imports it.
from gevent import monkey

monkey.patch_all()

from phi_api.server import serving  # noqa: E402
from phi_api.telemetry.logs import gunicorn_logconfig  # noqa: E402

_settings = serving.settings_or_exit()
serving.prepare_metrics_dir()  # before the app (and prometheus_client) is imported
serving.prepare_state_dir()  # the model registry and the slots, shared by the workers

bind = serving.bind_address(_settings)
workers = _settings.workers
worker_class = "phi_api.server.worker.Worker"  # gevent, answering protocol errors as JSON
worker_connections = 1000
preload_app = _settings.PRELOAD_MODEL
timeout = 30
graceful_timeout = 30
keepalive = 5
accesslog = None  # phi-api writes one line per request itself
errorlog = "-"
loglevel = _settings.LOG_LEVEL.lower()
logconfig_dict = gunicorn_logconfig(_settings.LOG_LEVEL, _settings.LOG_FORMAT)  # LOG_FORMAT=json: gunicorn's too
control_socket_disable = True

pre_fork = serving.pre_fork
post_worker_init = serving.post_worker_init
worker_exit = serving.worker_exit
child_exit = serving.child_exit
on_exit = serving.on_exit

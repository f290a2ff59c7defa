"""Benchmarks: one module per command (``python -m phi_api bench``, ``bench-spec``, ``bench-disk``, ...), each with
its ``add_cli_args`` and ``main``; :mod:`.common` holds what they share."""

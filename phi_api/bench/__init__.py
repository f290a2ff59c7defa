"""Benchmarks: one module per command (``phi-api bench serving``, ``phi-api bench spec``, ...), each with
its ``add_cli_args`` and ``main``; :mod:`.common` holds what they share."""

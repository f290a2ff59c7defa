"""phi-api's version: one place, imported by the modules that report it (never through the package root)."""

__version__ = "0.1.0"

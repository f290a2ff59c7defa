"""Admission limits: the server's generation slots and the API keys with their per-key limits and usage."""

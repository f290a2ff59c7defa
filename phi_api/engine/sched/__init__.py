"""Scheduling: the engine thread, its continuous batch, which requests start, and what each step costs."""

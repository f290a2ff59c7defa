"""The service layer: the one generation path (typed request in, events out), its admission, prompts, grammars
and tools; no Flask."""

"""The models a server serves: their specs and registry, the memory budget they share, loading, and pulls."""

"""Key/value memory: the pool's rows, the budget's books, prefix reuse in memory and on disk, int8 caches."""

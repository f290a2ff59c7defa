"""OpenAI's Chat Completions and Completions: their bodies parsed (:mod:`.parse`), their answers rendered
(:mod:`.answer`, in the :mod:`.shapes` of each)."""

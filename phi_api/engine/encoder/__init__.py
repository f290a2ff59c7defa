"""Encoder models (embeddings, rerankers) beside the generators: a folder's facts (:mod:`.folder`), its tokenizer
(:mod:`.tokens`), pooling and scores (:mod:`.pooling`), its session (:mod:`.session`), how waiting inputs are cut
into batches (:mod:`.batcher`), and the worker's encoder thread (:mod:`.loop`). No key/value cache: one session
call encodes a batch of inputs whole."""

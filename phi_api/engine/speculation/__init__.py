"""Speculative decoding from the prompt: drafts by n-gram lookup, checked in one step."""

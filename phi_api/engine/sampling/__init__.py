"""Choosing tokens: logits edits and sampling, grammar masks, and generated tokens turned into text."""

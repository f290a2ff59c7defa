"""The model and its runtime: the model folder, the tokenizer binding, the prepacked weights, the decoder session."""

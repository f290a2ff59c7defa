"""Each protocol's wire shapes over the one generation path: OpenAI's, the Responses API's, Anthropic's, Ollama's."""

"""The Batch API's runner: queued batch lines run through the one generation path, in every worker."""

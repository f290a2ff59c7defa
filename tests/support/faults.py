"""Constants shared by the fault-injecting WSGI entry point and the tests that use it."""

FAIL_SEED = 424242  # a request with this seed gets an engine failure
FAIL_AFTER_TOKENS = 3
FAIL_START_SEED = 535353  # a request with this seed fails in the engine as its prompt is in (its choices' start)

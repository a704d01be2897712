"""A small JAX training loop instrumented with the SDK, for demos and tests."""

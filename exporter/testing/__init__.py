"""Synthetic captures for tests and benchmarks (never imported by the product)."""

"""Test harnesses: real servers and load for tests and benchmarks; never shipped."""

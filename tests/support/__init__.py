"""Helpers the tests and benchmarks share: real servers, archives, streams, tools."""

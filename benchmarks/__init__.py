"""Benchmarks of the trainer against hand-written loops: ``python -m benchmarks.run``."""

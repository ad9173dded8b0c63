"""Parallelism Lab's helper library: launch ranks, trace communication, cost models, checks.

Notebooks, tests and benchmarks import from here; see each submodule's docstring.
"""

__version__ = "0.1.0"

"""pglab: reproducible PostgreSQL platform benchmarks from one plan file."""

__version__ = "0.1.0"

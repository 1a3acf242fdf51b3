"""Results store: SQLite (versioned schema) plus one artifact folder per run."""

from pglab.store.sqlite import Store

__all__ = ["Store"]

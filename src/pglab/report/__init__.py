"""Reports: tables from the store (terminal, Markdown, CSV, JSON)."""

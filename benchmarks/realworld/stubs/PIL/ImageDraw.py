"""stubs/PIL: importable only."""

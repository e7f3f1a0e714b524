"""Tiny models and tokenizers built offline, for the tests, bench/ and scripts/ (the package never imports this)."""

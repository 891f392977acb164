"""Models that take text: tokenization and the text settings (pooling, length) both backends use."""

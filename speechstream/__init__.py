"""speechstream: streaming speech-to-text with decoder-only LLMs and group position encoding."""

__version__ = "0.1.0"

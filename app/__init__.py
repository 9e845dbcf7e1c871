"""Tandem: speculative decoding for local language models. Everything here is Qt-widget-free."""

__version__ = "0.1.0"

"""Decoding: plain and speculative. Array-library-free; backends hold the arrays."""

"""Conversations and their history, Qt-free: the SQLite store and fitting a chat into the context."""

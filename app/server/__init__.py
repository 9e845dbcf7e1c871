"""The local server: the loaded pair over an OpenAI-compatible HTTP API (app/server/openai_api.py)."""

"""A target served by another engine (another Tandem, vLLM, SGLang, llama.cpp's server, any
OpenAI-compatible server): its address, its key, the HTTP client, and the runner's side of it."""

"""Finding, fetching, importing, loading and pairing models."""

"""Pairing models: drag and drop on the slots, hub downloads, the catalog and recent pairs."""

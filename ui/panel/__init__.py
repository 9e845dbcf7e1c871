"""The side panel: draft activity as token chips, live figures and graphs, race mode."""

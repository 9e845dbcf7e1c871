"""Errors about model files that the user can act on."""


class ModelFileError(ValueError):
    """A model file or folder is unusable. The message names the path, what is wrong and what to do."""

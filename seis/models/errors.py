class ModelError(ValueError):
    """A model name or directory that cannot be used (unknown, missing files, bad config)."""

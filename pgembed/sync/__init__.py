"""The sync path: claim queued keys, embed their text, write the vectors back."""

"""A model over time: add, remove, alter, reindex online, rebuild the index, report status."""

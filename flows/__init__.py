"""Prefect flows: protocol scheduling and fan-in; no logic of their own."""

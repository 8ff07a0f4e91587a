"""The rollnet Python SDK."""

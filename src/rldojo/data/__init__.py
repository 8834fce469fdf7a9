"""rldojo.data."""

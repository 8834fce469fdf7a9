"""rldojo.report."""

"""rldojo.data: reading task data (JSONL/Parquet/HF datasets), curation and mixing.

`loading` turns user files into rows and raises `DataError` with the file, line and field
when the input is bad.
"""

from rldojo.data.loading import DataError, read_rows, require_any_field, require_field

__all__ = ["DataError", "read_rows", "require_any_field", "require_field"]

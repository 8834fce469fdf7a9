"""Reading task rows from user files (JSON lines, JSON arrays, Parquet) with precise errors.

`read_rows(path)` yields ``(number, row)`` pairs, where `number` is the 1-based line of a
JSON-lines file or the 1-based row of a Parquet file or JSON array. Every problem with the
input raises `DataError`, whose message is one line naming the file, the line and (where
it applies) the field:

    data/x.jsonl:7: field 'answer': missing

`require_field` / `require_any_field` check one field of a row and raise that error.
Environments such as math-v1 build their tasks with them.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

__all__ = ["DataError", "read_rows", "require_any_field", "require_data_file", "require_field"]

JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")


class DataError(ValueError):
    """Bad input data; the message is ``"<file>:<line>: <what>"`` on one line."""

    def __init__(self, path: str | os.PathLike[str], line: int | None, message: str) -> None:
        where = f"{os.fspath(path)}:{line}" if line is not None else os.fspath(path)
        super().__init__(f"{where}: {' '.join(message.split())}")
        self.path = os.fspath(path)
        self.line = line


def _suffix(path: Path) -> str:
    """The data suffix, looking through a trailing ``.gz``."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    return suffixes[-1] if suffixes else ""


def _open_text(path: Path) -> IO[str]:
    if path.suffix.lower() == ".gz":
        return gzip.open(path, "rt", encoding="utf-8-sig")
    return path.open("r", encoding="utf-8-sig")


def read_rows(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_or_row_number, row)`` for every record of a data file.

    Formats by suffix (optionally followed by ``.gz`` for the JSON ones):
    ``.jsonl``/``.ndjson``/``.json`` JSON lines, one object per line, blank lines
    skipped (a ``.json`` file that starts with ``[`` is read as an array of objects);
    ``.parquet``/``.pq`` via pyarrow. Raises `DataError` for an unknown suffix, a line
    that is not valid JSON, or a record that is not an object.
    """
    p = require_data_file(path)
    yield from _read_parquet(p) if _suffix(p) in PARQUET_SUFFIXES else _read_json(p)


def require_data_file(path: str | os.PathLike[str]) -> Path:
    """`path` as a `Path`, checked to be an existing file of a type `read_rows` reads;
    else `DataError` ``"<path>: no such file"`` (or ``not a file``, ``unsupported file
    type``). Call it before anything else touches the file (a stat, a cache key), so a
    missing file is this one line and not an OSError."""
    p = Path(path)
    suffix = _suffix(p)
    if suffix not in PARQUET_SUFFIXES + JSON_SUFFIXES:
        known = ", ".join(JSON_SUFFIXES + PARQUET_SUFFIXES)
        raise DataError(
            p, None, f"unsupported file type {suffix or '(none)'!r}; use one of {known}"
        )
    if not p.is_file():
        raise DataError(p, None, "no such file" if not p.exists() else "not a file")
    return p


def _read_json(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        with _open_text(path) as f:
            first = f.read(1)
            while first.isspace():
                first = f.read(1)
            f.seek(0)
            if first == "[":
                yield from _read_json_array(path, f)
                return
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DataError(
                        path, number, f"malformed JSON: {exc.msg} (column {exc.colno})"
                    ) from None
                if not isinstance(row, dict):
                    raise DataError(path, number, f"expected a JSON object, got {_type_name(row)}")
                yield number, row
    except UnicodeDecodeError as exc:
        raise DataError(path, None, f"not UTF-8 text: {exc.reason}") from None


def _read_json_array(path: Path, f: IO[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        rows = json.load(f)
    except json.JSONDecodeError as exc:
        raise DataError(
            path, exc.lineno, f"malformed JSON: {exc.msg} (column {exc.colno})"
        ) from None
    for number, row in enumerate(rows, start=1):
        if not isinstance(row, dict):
            raise DataError(path, number, f"expected a JSON object, got {_type_name(row)}")
        yield number, row


def _read_parquet(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise DataError(path, None, f"not a readable Parquet file: {exc}") from None
    number = 0
    for batch in table.iter_batches(batch_size=1024):
        for row in batch.to_pylist():
            number += 1
            yield number, row


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, list | tuple):
        return "list"
    return type(value).__name__


def require_field(
    row: Mapping[str, Any],
    field: str,
    path: str | os.PathLike[str],
    line: int,
    types: tuple[type, ...] = (str,),
) -> Any:
    """``row[field]``, checked to be present, not null and of one of `types`.

    ``bool`` is not accepted as ``int`` or ``float`` unless `types` names it.
    Raises `DataError` ``"<path>:<line>: field '<field>': missing"`` or
    ``"...: expected str, got int"``.
    """
    if field not in row or row[field] is None:
        raise DataError(path, line, f"field {field!r}: missing")
    value = row[field]
    is_bool = isinstance(value, bool) and bool not in types
    if is_bool or not isinstance(value, types):
        wanted = " or ".join(t.__name__ for t in types)
        raise DataError(path, line, f"field {field!r}: expected {wanted}, got {_type_name(value)}")
    return value


def require_any_field(
    row: Mapping[str, Any],
    fields: Sequence[str],
    path: str | os.PathLike[str],
    line: int,
    types: tuple[type, ...] = (str,),
) -> tuple[str, Any]:
    """The first of `fields` present (non-null) in `row`, as ``(name, value)``, type-checked.

    When none is present: ``"<path>:<line>: field 'prompt|problem|question': missing"``.
    """
    for field in fields:
        if row.get(field) is not None:
            return field, require_field(row, field, path, line, types)
    raise DataError(path, line, f"field {'|'.join(fields)!r}: missing")

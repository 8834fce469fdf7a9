"""read_rows and the field checks: line numbers, one-line errors naming file, line, field."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rldojo.data.loading import DataError, read_rows, require_any_field, require_field


def test_jsonl_rows_keep_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text('{"a": 1}\n\n{"a": 2}\n   \n{"a": 3}\n')
    assert list(read_rows(path)) == [(1, {"a": 1}), (3, {"a": 2}), (5, {"a": 3})]


def test_json_array_gzip_and_parquet(tmp_path: Path) -> None:
    array = tmp_path / "x.json"
    array.write_text(json.dumps([{"a": 1}, {"a": 2}], indent=2))
    assert list(read_rows(array)) == [(1, {"a": 1}), (2, {"a": 2})]

    gz = tmp_path / "x.jsonl.gz"
    with gzip.open(gz, "wt") as f:
        f.write('{"a": 1}\n{"a": 2}\n')
    assert [row for _, row in read_rows(gz)] == [{"a": 1}, {"a": 2}]

    parquet = tmp_path / "x.parquet"
    pq.write_table(pa.table({"a": [1, 2, 3], "b": ["x", None, "z"]}), parquet)
    assert list(read_rows(parquet)) == [
        (1, {"a": 1, "b": "x"}),
        (2, {"a": 2, "b": None}),
        (3, {"a": 3, "b": "z"}),
    ]


def test_malformed_json_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n{"a": \n')
    with pytest.raises(DataError) as info:
        list(read_rows(path))
    message = str(info.value)
    assert message.startswith(f"{path}:3: malformed JSON: ")
    assert "\n" not in message
    assert (info.value.path, info.value.line) == (str(path), 3)


def test_non_object_row_and_unknown_suffix(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text('{"a": 1}\n[1, 2]\n')
    with pytest.raises(DataError, match=r"x\.jsonl:2: expected a JSON object, got list$"):
        list(read_rows(path))
    with pytest.raises(DataError, match=r"x\.csv: unsupported file type '\.csv'"):
        list(read_rows(tmp_path / "x.csv"))


def test_require_field() -> None:
    row = {"s": "text", "n": 3, "b": True, "none": None}
    assert require_field(row, "s", "f.jsonl", 4) == "text"
    assert require_field(row, "n", "f.jsonl", 4, (str, int)) == 3
    with pytest.raises(DataError, match=r"^f\.jsonl:4: field 'answer': missing$"):
        require_field(row, "answer", "f.jsonl", 4)
    with pytest.raises(DataError, match=r"^f\.jsonl:4: field 'none': missing$"):
        require_field(row, "none", "f.jsonl", 4)
    with pytest.raises(DataError, match=r"^f\.jsonl:4: field 'n': expected str, got int$"):
        require_field(row, "n", "f.jsonl", 4)
    with pytest.raises(DataError, match=r"field 'b': expected int or float, got bool$"):
        require_field(row, "b", "f.jsonl", 4, (int, float))


def test_require_any_field() -> None:
    row = {"problem": "p", "question": "q"}
    assert require_any_field(row, ("prompt", "problem", "question"), "f", 1) == ("problem", "p")
    with pytest.raises(DataError, match=r"^f:2: field 'answer\|solution': missing$"):
        require_any_field(row, ("answer", "solution"), "f", 2)

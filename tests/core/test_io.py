"""`autoprec._core.io`: atomic writes that never leave a partial file, JSON reads that name the file."""

from __future__ import annotations

import json
import os

import pytest

from autoprec._core.io import atomic_write_json, atomic_write_text, parse_json_text, read_json_file
from autoprec.errors import PlanError


def test_atomic_write_text_creates_the_folder_and_replaces_the_file(tmp_path):
    path = tmp_path / "new" / "folder" / "plan.json"
    assert atomic_write_text(path, "first") == path
    assert path.read_text() == "first"
    atomic_write_text(str(path), "second")
    assert path.read_text() == "second"
    assert os.listdir(path.parent) == ["plan.json"]  # no temporary file is left


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "plan.json"
    atomic_write_json(path, {"kept": True})
    with pytest.raises(TypeError):
        atomic_write_json(path, {"value": object()})  # not JSON-serialisable: fails before
    with pytest.raises(UnicodeEncodeError):
        atomic_write_text(path, "half \udcff written")  # fails while writing the temporary
    assert json.loads(path.read_text()) == {"kept": True}
    assert os.listdir(tmp_path) == ["plan.json"]


def test_atomic_write_json_is_indented_and_ends_with_a_newline(tmp_path):
    path = atomic_write_json(tmp_path / "data.json", {"b": 1, "a": [1, 2]})
    text = path.read_text()
    assert text.endswith("}\n") and '\n  "b": 1' in text
    assert list(json.loads(text)) == ["b", "a"]  # key order kept


def test_read_json_file_returns_the_value(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text('{"layers": {}}')
    assert read_json_file(path, PlanError, "precision plan") == {"layers": {}}


def test_read_json_file_names_a_missing_file(tmp_path):
    missing = tmp_path / "missing.json"
    with pytest.raises(PlanError) as error:
        read_json_file(missing, PlanError, "precision plan")
    assert str(error.value) == f"{missing}: no such file; expected a precision plan JSON file."


def test_read_json_file_names_an_unreadable_file(tmp_path):
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(PlanError, match=r"binary\.json: cannot read precision plan: "):
        read_json_file(binary, PlanError, "precision plan")
    with pytest.raises(PlanError, match="cannot read profile: "):
        read_json_file(tmp_path, PlanError, "profile")  # a folder


@pytest.mark.parametrize("text", ["", "  \n"])
def test_empty_text_says_truncated(text):
    with pytest.raises(ValueError) as error:
        parse_json_text(text, ValueError, "profile", source="p.json")
    assert str(error.value) == "p.json: the profile is empty (truncated write?); re-create it."


def test_invalid_json_names_line_and_column():
    with pytest.raises(PlanError) as error:
        parse_json_text('{\n  "layers": ,\n}', PlanError, "precision plan", source="plan.json")
    message = str(error.value)
    assert message.startswith("plan.json: not valid JSON at line 2, column 13: Expecting value.")
    assert message.endswith(
        "The precision plan may be truncated or hand-edited; fix it or re-create it."
    )
    assert error.value.__cause__ is None and error.value.__suppress_context__

"""The YAML configuration loader: a mapping, or a YAMLFileError naming the file, line and column."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slorouter.yamlfile import YAMLFileError, load_yaml_mapping, parse_yaml_mapping


def fails(text: str, message: str) -> None:
    with pytest.raises(YAMLFileError) as info:
        parse_yaml_mapping(text, "f.yaml", "test config")
    assert str(info.value) == message


def test_a_mapping_is_returned_with_anchors_and_merges():
    text = "base: &b {x: 1, y: 2}\nderived:\n  <<: *b\n  y: 3\nlist: [1, two]\n"
    assert parse_yaml_mapping(text, "f.yaml", "test config") == {
        "base": {"x": 1, "y": 2},
        "derived": {"x": 1, "y": 3},
        "list": [1, "two"],
    }


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "---\n"])
def test_no_document_is_none(text):
    assert parse_yaml_mapping(text, "f.yaml", "test config") is None


def test_syntax_errors_name_line_and_column():
    fails(
        "plugins:\n  - type: queue-scorer\n   name: x\n",
        "f.yaml: invalid YAML (line 3, column 4): expected <block end>, but found '<block mapping start>' "
        "(while parsing a block collection at line 2, column 3)",
    )
    fails("a: b: c\n", "f.yaml: invalid YAML (line 1, column 5): mapping values are not allowed here")
    fails("a: *nowhere\n", "f.yaml: invalid YAML (line 1, column 4): found undefined alias 'nowhere'")


def test_duplicate_keys_are_errors_at_any_depth():
    fails(
        "a: 1\nb: 2\na: 3\n", "f.yaml: invalid YAML (line 3, column 1): duplicate key 'a' (first at line 1)"
    )
    fails(
        "pool:\n  endpoints: [x]\n  scrape_interval_ms: 5\n  endpoints: [y]\n",
        "f.yaml: invalid YAML (line 4, column 3): duplicate key 'endpoints' (first at line 2)",
    )
    fails(
        "a: [{k: 1, k: 2}]\n", "f.yaml: invalid YAML (line 1, column 12): duplicate key 'k' (first at line 1)"
    )
    # Keys equal as Python values collide in the dict too.
    fails("1: a\n1.0: b\n", "f.yaml: invalid YAML (line 2, column 1): duplicate key 1.0 (first at line 1)")


def test_non_mapping_documents_are_errors():
    fails("- a\n- b\n", "f.yaml: the test config must be a mapping, got list")
    fails("just text\n", "f.yaml: the test config must be a mapping, got str")
    fails("42\n", "f.yaml: the test config must be a mapping, got int")


def test_several_documents_are_an_error():
    fails(
        "a: 1\n---\nb: 2\n",
        "f.yaml: invalid YAML (line 2, column 1): found another document "
        "(expected a single document in the stream at line 1, column 1)",
    )


def test_values_python_rejects_are_errors_with_their_place():
    fails("d: 2001-02-30\n", "f.yaml: invalid YAML (line 1, column 4): day is out of range for month")
    fails("t: !!timestamp soon\n", "f.yaml: invalid YAML (line 1, column 4): not a valid timestamp")
    fails("b: !!bool maybe\n", "f.yaml: invalid YAML (line 1, column 4): not a valid bool")
    with pytest.raises(YAMLFileError, match=re.escape("f.yaml: invalid YAML (line 1, column 4): Exceeds")):
        parse_yaml_mapping("n: " + "1" * 5000, "f.yaml", "test config")


def test_characters_yaml_forbids_and_deep_nesting_are_errors():
    fails(
        "a: 1\nb: \x01\n",
        "f.yaml: invalid YAML (line 2, column 4): unacceptable character #x0001 (special characters are not "
        "allowed)",
    )
    fails("a: " + "[" * 5000, "f.yaml: invalid YAML: nested too deeply")
    fails("a: &x\n  b: *x\n", "f.yaml: invalid YAML (line 1, column 4): found unconstructable recursive node")


def test_file_errors(tmp_path):
    path = tmp_path / "c.yaml"
    with pytest.raises(YAMLFileError, match=re.escape(f"{path}: cannot read the serve config: No such file")):
        load_yaml_mapping(path, "serve config")
    path.write_bytes(b"a: \xff\n")
    with pytest.raises(YAMLFileError) as info:
        load_yaml_mapping(path, "serve config")
    assert str(info.value) == f"{path}: the serve config is not UTF-8 text (byte 3)"
    path.write_text("a: 1\na: 2\n")
    with pytest.raises(YAMLFileError, match=re.escape(f"{path}: invalid YAML (line 2, column 1): duplicate")):
        load_yaml_mapping(path, "serve config")
    path.write_text("a: {b: [1, 2]}\n")
    assert load_yaml_mapping(str(path), "serve config") == {"a": {"b": [1, 2]}}


# Pieces of YAML syntax, so that the generated text reaches the parser's and constructors' corners
# (anchors, aliases, merges, tags, flow and block collections), not only the scanner's.
_SCALARS = ["a", "b", "1", "1.5", "0x1f", "2001-02-30", "~", "null", "yes", '"q"', "'s'"]
_INDICATORS = [":", ": ", "- ", "? ", "[", "]", "{", "}", ",", "&a ", "*a", "<<: ", "|", ">", "#", "---"]
_TAGS = ["!!str ", "!!int ", "!!map ", "!!set ", "!!seq ", "!!timestamp ", "!!binary ", "!!python/object "]
_SPACES = ["\n", "\n  ", "  ", "\t", "\x00", "\ufeff", "...", "%YAML 1.1"]
_PIECES = st.sampled_from([*_SCALARS, *_INDICATORS, *_TAGS, *_SPACES])
_YAMLISH = st.lists(st.one_of(_PIECES, st.text(max_size=3)), max_size=40).map("".join)


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(), _YAMLISH))
def test_any_text_gives_a_mapping_none_or_the_loader_error(text):
    try:
        data = parse_yaml_mapping(text, "f.yaml", "test config")
    except YAMLFileError as exc:
        assert str(exc).startswith("f.yaml: ")
    else:
        assert data is None or isinstance(data, dict)

"""``publish_folder``: the one way a folder is published whole (caches, KB store, conversions, exports)."""

from __future__ import annotations

import pytest

from cbr2.common.files import publish_folder


def _hidden(parent):
    return [p.name for p in parent.iterdir() if p.name.startswith(".")]


def _writer(text):
    def build(tmp):
        (tmp / "data.txt").write_text(text)
    return build


def test_a_build_is_renamed_into_place_and_nothing_else_is_left(tmp_path):
    dest = tmp_path / "sub" / "entry"
    assert publish_folder(dest, _writer("a")) is True
    assert (dest / "data.txt").read_text() == "a"
    assert _hidden(dest.parent) == []


def test_a_folder_already_there_wins_unless_replace_is_asked(tmp_path):
    dest = tmp_path / "entry"
    publish_folder(dest, _writer("first"))
    assert publish_folder(dest, _writer("second")) is False  # a concurrent winner is kept
    assert (dest / "data.txt").read_text() == "first"
    assert publish_folder(dest, _writer("third"), replace=True) is True
    assert (dest / "data.txt").read_text() == "third"
    assert _hidden(tmp_path) == []


def test_a_winner_that_appears_during_the_build_is_kept(tmp_path):
    dest = tmp_path / "entry"

    def build(tmp):
        (tmp / "data.txt").write_text("mine")
        dest.mkdir()  # another process renames its build into place meanwhile
        (dest / "data.txt").write_text("theirs")

    assert publish_folder(dest, build) is False
    assert (dest / "data.txt").read_text() == "theirs"
    assert _hidden(tmp_path) == []


def test_a_failed_build_leaves_nothing(tmp_path):
    dest = tmp_path / "entry"

    def build(tmp):
        (tmp / "half.txt").write_text("x")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        publish_folder(dest, build)
    assert list(tmp_path.iterdir()) == []

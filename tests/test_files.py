"""``publish_folder``: the one way a folder is published whole (caches, KB store, conversions, exports);
``known_sha256``: a large file hashed once per identity."""

from __future__ import annotations

import os
import time

import pytest

from cbr2.common import files
from cbr2.common.files import file_sha256, known_sha256, publish_folder


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


# ----------------------------------------------------------------------------- known_sha256

def test_a_settled_file_is_hashed_once_and_a_rewritten_one_again(tmp_path, monkeypatch):
    # A test cannot date a file's change time back: here a file counts as settled at once.
    monkeypatch.setattr(files, "SETTLED_S", 0.0)
    cache, kb = tmp_path / "cache", tmp_path / "kb.json"
    kb.write_text("first")
    time.sleep(0.01)
    memo_mtime = kb.stat().st_mtime_ns
    assert known_sha256(kb, cache) == file_sha256(kb)
    (memo,) = (cache / "sha256").iterdir()
    memo.write_text("f" * 64 + "\n")  # what the memo says is what an unchanged file is taken to hold
    assert known_sha256(kb, cache) == "f" * 64
    kb.write_text("other")  # same size, another content; dated back to the first one's time
    os.utime(kb, ns=(kb.stat().st_atime_ns, int(memo_mtime)))
    assert known_sha256(kb, cache) == file_sha256(kb) != "f" * 64


def test_a_file_that_just_changed_is_not_remembered(tmp_path):
    cache, kb = tmp_path / "cache", tmp_path / "kb.json"
    kb.write_text("fresh")  # a rewrite within the same clock tick could keep this identity
    assert known_sha256(kb, cache) == file_sha256(kb)
    assert not (cache / "sha256").exists()

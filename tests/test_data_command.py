"""``python -m cbr2.data fetch`` against a local HTTP server in each source's layout, and
``python -m cbr2.data check`` on broken and real folders: every problem named, then the counts."""

from __future__ import annotations

import copy
import dataclasses
import http.server
import io
import json
import shutil
import socket
import threading
import zipfile
from pathlib import Path

import pytest
from conftest import TINY_KB

from cbr2.data.__main__ import main
from cbr2.data.benchmarks import EMBEDDED_ROOT
from cbr2.data.check import check_folder, kqapro_files, metaqa_files
from cbr2.data.fetch import SOURCES, BrokenDownload, FetchError, fetch, sha256_of
from cbr2.data.questions import load_metaqa_questions

SHARED_METAQA = Path(__file__).resolve().parents[2] / "shared" / "data" / "metaqa-test-questions"
MINI_KQAPRO, MINI_METAQA = EMBEDDED_ROOT / "mini-kqapro", EMBEDDED_ROOT / "mini-metaqa"


@pytest.fixture(autouse=True)
def _test_logging(monkeypatch):
    monkeypatch.setattr("cbr2.data.__main__.setup_logging", lambda: None)  # the test process keeps its logging


# ----------------------------------------------------------------- a local server

class Server:
    """An HTTP server on 127.0.0.1 serving ``files`` (URL path → bytes), with ``Range`` support.

    ``break_after[path] = n`` makes the next response for ``path`` announce the whole length
    but close after ``n`` bytes (a broken connection), once. ``ignore_range`` answers every
    request with the whole file (a server without ``Range``). ``requests`` records
    ``(path, Range header)``.
    """

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.break_after: dict[str, int] = {}
        self.ignore_range = False
        self.requests: list[tuple[str, str | None]] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                path = self.path.partition("?")[0]
                wanted = self.headers.get("Range")
                server.requests.append((path, wanted))
                if path not in server.files:
                    self.send_error(404)
                    return
                body, start = server.files[path], 0
                if wanted and not server.ignore_range:
                    start = int(wanted.removeprefix("bytes=").partition("-")[0])
                    if start >= len(body):
                        self.send_error(416)
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                cut = server.break_after.pop(path, None)
                self.wfile.write(body[start:] if cut is None else body[start:start + cut])
                if cut is not None:
                    self.close_connection = True

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def serve_folder(self, prefix: str, folder: Path, names: list[str]) -> None:
        for name in names:
            self.files[f"{prefix}/{name}"] = (folder / name).read_bytes()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _zip_of(folder: Path, inner: str, extra: dict[str, bytes] | None = None) -> bytes:
    """A zip holding ``folder``'s KQA Pro files under ``inner/`` (as the release unzips to a folder)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("readme.txt", "not part of the layout")
        for name in kqapro_files():
            zf.write(folder / name, f"{inner}/{name}")
        for name, data in (extra or {}).items():
            zf.writestr(name, data)
    return buf.getvalue()


def _same_files(a: Path, b: Path, names: list[str]) -> bool:
    return all((a / n).read_bytes() == (b / n).read_bytes() for n in names)


# ------------------------------------------------------------------------- fetch

def test_release_zip_is_verified_unpacked_and_checked(server, tmp_path, capsys):
    server.files["/f/abc/"] = _zip_of(MINI_KQAPRO, "KQAPro.IID")
    out = tmp_path / "kqapro"
    assert main(["fetch", "kqapro", str(out), "--source", "release", "--url", f"{server.url}/f/abc/?dl=1"]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(kqapro_files())  # the zip is gone once unpacked
    assert _same_files(out, MINI_KQAPRO, kqapro_files())
    printed = capsys.readouterr().out
    assert "fetched kqapro from release" in printed and "result: clean" in printed


def test_a_corrupt_or_foreign_archive_is_refused(server, tmp_path):
    good = _zip_of(MINI_KQAPRO, "KQAPro")
    server.files["/bad.zip"] = good[:200] + bytes([good[200] ^ 0xFF]) + good[201:]  # a flipped byte in the data
    server.files["/page.zip"] = b"<html>Link does not exist</html>"  # what a dead share link serves
    for name in ("bad.zip", "page.zip"):
        with pytest.raises(FetchError):
            fetch("kqapro", tmp_path / name, "release", f"{server.url}/{name}")
        assert not list((tmp_path / name).iterdir())  # nothing laid out, nothing kept


def test_mirror_files_are_checked_against_their_digests(server, tmp_path, monkeypatch):
    server.serve_folder("/drt", MINI_KQAPRO, kqapro_files())
    # The real digests are of the real files: the mini copies must be refused, and not kept.
    with pytest.raises(FetchError, match="sha256"):
        fetch("kqapro", tmp_path / "refused", "mirror", f"{server.url}/drt/")
    assert not list((tmp_path / "refused").iterdir())
    release, mirror = SOURCES["kqapro"]
    digests = {n: sha256_of(MINI_KQAPRO / n) for n in kqapro_files()}
    monkeypatch.setitem(SOURCES, "kqapro", (release, dataclasses.replace(mirror, sha256=digests)))
    out = tmp_path / "kqapro"
    assert fetch("kqapro", out, "mirror", f"{server.url}/drt").name == "mirror"
    assert _same_files(out, MINI_KQAPRO, kqapro_files())
    server.requests.clear()
    fetch("kqapro", out, "mirror", f"{server.url}/drt")  # every file in place and verified: nothing downloaded
    assert server.requests == []


def test_a_broken_download_resumes_where_it_stopped(server, tmp_path):
    server.serve_folder("/m", MINI_METAQA, metaqa_files())
    server.break_after["/m/kb.txt"] = 10_000
    out = tmp_path / "metaqa"
    with pytest.raises(BrokenDownload, match="10,000 of"):
        fetch("metaqa", out, url=f"{server.url}/m")
    assert (out / "kb.txt.part").stat().st_size == 10_000 and not (out / "kb.txt").exists()
    server.requests.clear()
    fetch("metaqa", out, url=f"{server.url}/m")
    assert server.requests[0] == ("/m/kb.txt", "bytes=10000-")
    assert _same_files(out, MINI_METAQA, metaqa_files()) and not list(out.rglob("*.part"))
    report = check_folder(out)
    assert report.clean and report.kind == "metaqa" and report.kb["relation_facts"] > 0
    assert {split: sum(c.values()) for split, c in report.questions.items()} == {"train": 1500, "dev": 300, "test": 450}


def test_a_server_without_range_starts_over(server, tmp_path):
    server.files["/x/kb.json"] = (MINI_KQAPRO / "kb.json").read_bytes()
    server.break_after["/x/kb.json"] = 5_000
    server.ignore_range = True
    from cbr2.data.fetch import download

    with pytest.raises(BrokenDownload):
        download(f"{server.url}/x/kb.json", tmp_path / "kb.json")
    download(f"{server.url}/x/kb.json", tmp_path / "kb.json")  # 200 to a Range request: the part is rewritten
    assert (tmp_path / "kb.json").read_bytes() == server.files["/x/kb.json"]


def test_a_part_that_is_already_whole_is_finished_not_fetched_again(server, tmp_path):
    from cbr2.data.fetch import download

    body = (MINI_KQAPRO / "kb.json").read_bytes()
    server.files["/kb.json"] = body
    (tmp_path / "kb.json.part").write_bytes(body)  # a run that died between the last byte and the rename
    download(f"{server.url}/kb.json", tmp_path / "kb.json", sha256_of(MINI_KQAPRO / "kb.json"))
    assert server.requests == [("/kb.json", f"bytes={len(body)}-")]  # answered 416
    assert (tmp_path / "kb.json").read_bytes() == body and not (tmp_path / "kb.json.part").exists()


def test_without_a_network_the_error_is_one_line_with_urls_and_steps(tmp_path, monkeypatch, capsys):
    dead = f"http://127.0.0.1:{_closed_port()}"
    release, mirror = SOURCES["kqapro"]
    monkeypatch.setitem(SOURCES, "kqapro", (dataclasses.replace(release, url=f"{dead}/f/zip?dl=1"),
                                            dataclasses.replace(mirror, url=f"{dead}/drt/")))
    assert main(["fetch", "kqapro", str(tmp_path / "k")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: cannot fetch kqapro")
    assert f"{dead}/f/zip?dl=1" in err and f"{dead}/drt/kb.json" in err
    assert "put kb.json, train.json, val.json and test.json in" in err and "python -m cbr2.data check" in err
    # MetaQA's release has no direct download: the same one line, without a network at all.
    assert main(["fetch", "metaqa", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "drive.google.com/drive/folders/0B-36Uca2AvwhTWVFSUZqRXVtbUE" in err
    assert "1,2,3}-hop/qa_{train,dev,test}_qtype.txt" in err and "--url BASE" in err


def test_url_needs_a_source_where_there_are_several(tmp_path, capsys):
    assert main(["fetch", "kqapro", str(tmp_path), "--url", "http://127.0.0.1:1/x"]) == 2
    assert "--url needs --source" in capsys.readouterr().err


# ------------------------------------------------------------------------- check

def _question(program=None, **changes):
    q = {"question": "How many humans are there?", "sparql": "SELECT ...",
         "program": program or [{"function": "FindAll", "dependencies": [], "inputs": []},
                                {"function": "FilterConcept", "dependencies": [0], "inputs": ["human"]},
                                {"function": "Count", "dependencies": [1], "inputs": []}],
         "choices": ["1", "2"], "answer": "2"}
    return {**q, **changes}


def test_check_lists_every_problem_of_every_file(tmp_path, capsys):
    kb = copy.deepcopy(TINY_KB)
    kb["entities"]["Q1"]["name"] = 5
    kb["entities"]["Q1"]["relations"][0]["object"] = "Q98"  # not looked at: Q1's structure is broken
    kb["entities"]["Q2"]["relations"][0]["object"] = "Q99"
    kb["entities"]["Q3"]["attributes"][0]["value"]["value"] = "many"
    kb["concepts"]["C3"]["subclassOf"] = ["C9"]
    (tmp_path / "kb.json").write_text(json.dumps(kb))
    fnd = [{"function": "Fnd", "dependencies": [], "inputs": ["x"]}]
    asks_nothing = [{"function": "Find", "dependencies": [], "inputs": ["Warsaw"]}]
    val = [_question(), _question(answer=6), _question(), _question(program=fnd), _question(question=""),
           _question(program=asks_nothing)]
    (tmp_path / "val.json").write_text(json.dumps(val))
    (tmp_path / "train.json").write_text('[{"question": "Q?",\n "answer": }]')
    (tmp_path / "test.json").write_text(json.dumps([{"question": "Which?", "choices": ["a"]}] * 3))
    assert main(["check", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    problems = out.split("problems (")[1].split("notes")[0].splitlines()[1:]
    assert [p.strip() for p in problems] == [
        'kb.json: entities["Q1"].name: expected a string, got the number 5',
        """kb.json: entities["Q3"].attributes[0].value.value: expected a number, got the string 'many'""",
        """kb.json: concepts["C3"].subclassOf[0]: unknown concept 'C9'""",
        """kb.json: entities["Q2"].relations[0].object: unknown entity or concept 'Q99'""",
        "train.json: line 2, column 12: not valid JSON (Expecting value)",
        "val.json: [1].answer: expected a string, got the number 6",
        "val.json: [4]: no question text: missing key 'question' (or 'rewrite' / 'origin')",
        "val.json: [3].program[0]: unknown function 'Fnd'",
        ("val.json: [5].program: last function 'Find' is not one of the nine categories' "
         "(Count, QueryAttr, QueryAttrQualifier, QueryName, QueryRelation, QueryRelationQualifier, SelectAmong, "
         "SelectBetween, Verify; QueryAttrUnderCondition counts as QueryAttr)"),
    ]
    assert "result: 9 problems" in out and "KB:" not in out
    assert "test.json: no programs or answers (the official test file)" in out
    table = out.split("questions per split and category (CT Count):\n")[1].splitlines()
    assert table[0].split() == ["split", "questions", "CT", "no", "program", "broken"]
    assert table[1].split() == ["val", "6", "3", "0", "3"] and table[2].split() == ["test", "3", "0", "3", "0"]


def test_check_of_a_clean_folder_counts_questions_and_kb(capsys):
    assert main(["check", str(MINI_KQAPRO)]) == 0
    out = capsys.readouterr().out
    assert "problems" not in out and out.rstrip().endswith("result: clean")
    assert "KB: 643 entities, 88 concepts, 2,457 attribute facts, 2,086 relation facts" in out
    report = check_folder(MINI_KQAPRO)
    assert {s: sum(c.values()) for s, c in report.questions.items()} == {"train": 2000, "val": 450, "test": 450}
    assert set(report.questions["val"].values()) == {50}


def test_check_of_a_broken_metaqa_folder(tmp_path):
    shutil.copytree(MINI_METAQA, tmp_path, dirs_exist_ok=True)
    kb = tmp_path / "kb.txt"
    kb.write_text(kb.read_text() + "A|directed_by\nB|produced_by|C\n")
    qa = tmp_path / "2-hop/vanilla/qa_dev.txt"
    lines = qa.read_text().splitlines()
    lines[4] = lines[4].replace("\t", " ")
    qa.write_text("\n".join(lines) + "\n")
    qtype = tmp_path / "1-hop/qa_test_qtype.txt"
    qtypes = qtype.read_text().splitlines()
    qtypes[2] = "movie_to_producer"
    qtype.write_text("\n".join(qtypes) + "\n")
    (tmp_path / "3-hop/qa_train_qtype.txt").write_text("movie_to_director\n")
    report = check_folder(tmp_path)
    n_kb = len(kb.read_text().splitlines())
    first, unknown_relation, *others = report.problems
    assert first == f"kb.txt: line {n_kb - 1}: expected 'head|relation|tail' (two '|'), got 'A|directed_by'"
    assert unknown_relation.startswith(f"kb.txt: line {n_kb}: relation: expected 'directed_by', ")
    assert unknown_relation.endswith("got the string 'produced_by'")
    assert [o.split(" (known types")[0] for o in others] == [
        "3-hop/qa_train_qtype.txt: 1 lines, but 3-hop/vanilla/qa_train.txt has 500",
        f"2-hop/vanilla/qa_dev.txt: line 5: expected 'question<TAB>answers' (no tab), got {lines[4]!r}",
        "1-hop/qa_test_qtype.txt: line 3: qtype 'movie_to_producer': cannot read the hop movie_to_producer",
    ]
    assert not report.clean and report.kb is None
    # What has no problem is still counted: the 3-hop train questions by their folder, the rest by qtype.
    assert {s: sum(c.values()) for s, c in report.questions.items()} == {"train": 1500, "dev": 299, "test": 449}


# ------------------------------------------------------------ questions without qtypes

def test_metaqa_questions_without_qtype_files_load_with_their_hop(tmp_path):
    for k in (1, 3):
        (tmp_path / f"{k}-hop/vanilla").mkdir(parents=True)
        shutil.copy(MINI_METAQA / f"{k}-hop/vanilla/qa_test.txt", tmp_path / f"{k}-hop/vanilla/qa_test.txt")
    shutil.copy(MINI_METAQA / "3-hop/qa_test_qtype.txt", tmp_path / "3-hop/qa_test_qtype.txt")
    questions = load_metaqa_questions(tmp_path, "test", (1, 3))
    with_qtypes = load_metaqa_questions(MINI_METAQA, "test", (1, 3))
    assert [(q.qid, q.question, q.answer, q.category) for q in questions] == [
        (q.qid, q.question, q.answer, q.category) for q in with_qtypes]
    assert all(q.program is None for q in questions if q.category == "1-hop")
    assert all(q.program is not None for q in questions if q.category == "3-hop")


@pytest.mark.skipif(not SHARED_METAQA.is_dir(), reason="shared MetaQA test questions are not beside the checkout")
def test_the_real_metaqa_test_questions_load_and_check(capsys):
    questions = load_metaqa_questions(SHARED_METAQA, "test")
    assert len(questions) == 39_093 and all(q.program is None for q in questions)
    assert main(["check", str(SHARED_METAQA)]) == 0
    out = capsys.readouterr().out
    assert "  test      39,093  9,947  14,872  14,274" in out
    assert "kb.txt: absent" in out and "no gold program" in out and "result: clean" in out


def test_a_case_pool_without_gold_programs_is_refused_in_one_line(tmp_path):
    from omegaconf import OmegaConf

    from cbr2.config import RetrievalConfig
    from cbr2.data.benchmarks import Benchmark
    from cbr2.data.reading import DataError
    from cbr2.retrieval.retriever import Retriever

    shutil.copytree(MINI_METAQA, tmp_path, dirs_exist_ok=True)
    for k in (1, 2, 3):
        (tmp_path / f"{k}-hop/qa_train_qtype.txt").unlink()
    cfg = OmegaConf.structured(RetrievalConfig(cases="semantic"))
    with pytest.raises(DataError, match="1,500 of the 1,500 train questions have no gold program"):
        Retriever(Benchmark("metaqa", tmp_path), cfg)

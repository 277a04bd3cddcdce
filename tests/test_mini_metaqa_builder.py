"""The ``mini-metaqa`` builder: official MetaQA layout, determinism, and known answers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cbr2.data.builders.mini_metaqa import SIZES, SOURCE, MovieKB, build_mini_metaqa, kb_triples, load_movies

SPLITS = ("train", "dev", "test")
RELATIONS = {"directed_by", "written_by", "starred_actors", "release_year", "in_language",
             "has_tags", "has_genre", "has_imdb_votes", "has_imdb_rating"}
TOPIC = re.compile(r"\[([^\[\]]*)\]")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("mini_metaqa")
    return out, build_mini_metaqa(SOURCE, out, seed=0)


@pytest.fixture(scope="module")
def kb() -> MovieKB:
    return MovieKB(kb_triples(load_movies(SOURCE)))


def _rows(root: Path, hop: int, split: str) -> list[tuple[str, str, list[str], str]]:
    """(question, topic, answers, qtype) per line of one question file."""
    qa = (root / f"{hop}-hop" / "vanilla" / f"qa_{split}.txt").read_text(encoding="utf-8").splitlines()
    qtypes = (root / f"{hop}-hop" / f"qa_{split}_qtype.txt").read_text(encoding="utf-8").splitlines()
    assert len(qa) == len(qtypes)
    rows = []
    for line, qtype in zip(qa, qtypes):
        assert line.count("\t") == 1, line
        question, answers = line.split("\t")
        topics = TOPIC.findall(question)
        assert len(topics) == 1 and question.count("[") == 1 and question.count("]") == 1, line
        rows.append((question, topics[0], answers.split("|"), qtype))
    return rows


def test_rebuild_is_byte_identical(built, tmp_path):
    first, _ = built
    build_mini_metaqa(SOURCE, tmp_path, seed=0)
    files = sorted(p.relative_to(first) for p in first.rglob("*") if p.is_file())
    assert len(files) == 1 + 3 * 3 * 2
    assert files == sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    for rel in files:
        assert (first / rel).read_bytes() == (tmp_path / rel).read_bytes(), rel


def test_sizes_and_qtypes(built):
    root, stats = built
    assert stats["kb_triples"] == len((root / "kb.txt").read_text(encoding="utf-8").splitlines())
    for hop in (1, 2, 3):
        hop_stats = stats["hops"][f"{hop}-hop"]
        assert len(hop_stats["qtypes"]) >= 10
        for split in SPLITS:
            assert hop_stats[split] == SIZES[split] == len(_rows(root, hop, split))
            assert all(len(q.split("_to_")) == hop + 1 for *_, q in _rows(root, hop, split))


def test_kb_format(built):
    root, _ = built
    triples = [line.split("|") for line in (root / "kb.txt").read_text(encoding="utf-8").splitlines()]
    assert all(len(t) == 3 and all(t) for t in triples)
    assert {r for _, r, _ in triples} == RELATIONS
    heads = {h for h, _, _ in triples}
    assert not heads & {t for _, r, t in triples if r in {"directed_by", "written_by", "starred_actors"}}
    # Comma names are single entities, not split into pieces.
    assert ["Paris, Texas", "directed_by", "Wim Wenders"] in triples
    assert ["Girl, Interrupted", "starred_actors", "Winona Ryder"] in triples
    assert sum("," in h for h in heads) >= 5


def test_questions_are_consistent(built, kb):
    root, _ = built
    for hop in (1, 2, 3):
        rows = {split: _rows(root, hop, split) for split in SPLITS}
        for split, split_rows in rows.items():
            assert len({q for q, *_ in split_rows}) == len(split_rows), f"repeated question in {hop}-hop {split}"
            for question, topic, answers, qtype in split_rows:
                assert topic not in answers, question
                assert answers == sorted(set(answers)) and 0 < len(answers) <= 30, question
                assert answers == kb.answer(topic, qtype), question
        train = {(t, q) for _, t, _, q in rows["train"]}
        for split in ("dev", "test"):
            assert not train & {(t, q) for _, t, _, q in rows[split]}, f"{hop}-hop {split} leaks into train"


def test_comma_names_survive(built):
    root, _ = built
    seen = set()
    for hop in (1, 2, 3):
        for split in SPLITS:
            for _, topic, answers, _ in _rows(root, hop, split):
                seen.add(topic)
                seen.update(answers)
    assert "Paris, Texas" in seen
    assert "Texas" not in seen and " Texas" not in seen


@pytest.mark.parametrize("topic, qtype, expected", [
    ("Paris, Texas", "movie_to_director", ["Wim Wenders"]),
    ("Paris, Texas", "movie_to_director_to_movie", ["Wings of Desire"]),
    ("Girl, Interrupted", "movie_to_year", ["1999"]),
    ("Pedro Almodóvar", "director_to_movie",
     ["All About My Mother", "Talk to Her", "The Skin I Live In", "Volver",
      "Women on the Verge of a Nervous Breakdown"]),
    ("Joel Coen", "director_to_movie_to_director", ["Ethan Coen"]),
    ("Liv Ullmann", "actor_to_movie_to_actor", ["Bibi Andersson"]),
    ("Akira Kurosawa", "director_to_movie_to_language", ["Japanese"]),
    ("Christopher Nolan", "director_to_movie",
     ["Batman Begins", "Dunkirk", "Inception", "Insomnia", "Interstellar", "Memento",
      "The Dark Knight", "The Prestige"]),
    # MetaQA keeps the topic's own neighbours at the last hop: Bridge of Spies' writers
    # include the Coens, so its own director is among "directors of films by its writers".
    ("Bridge of Spies", "movie_to_writer_to_movie_to_director", ["Ethan Coen", "Joel Coen", "Steven Spielberg"]),
    ("The Good, the Bad and the Ugly", "movie_to_actor_to_movie_to_director", ["Clint Eastwood", "Don Siegel",
                                                                                "Sergio Leone"]),
])
def test_known_answers(kb, topic, qtype, expected):
    assert kb.answer(topic, qtype) == expected


def test_source_rules(tmp_path):
    bad = tmp_path / "bad.yaml"
    row = ('{title: "%s", year: 2000, directors: [%s], writers: [W], actors: [A], languages: [English], '
           'genres: [Drama], tags: [t], votes: known, rating: good}')
    bad.write_text("movies:\n- " + row % ("Same Name", "Same Name") + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="titles equal"):
        load_movies(bad)
    bad.write_text("movies:\n- " + row % ("A | B", "D") + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="bad name"):
        load_movies(bad)

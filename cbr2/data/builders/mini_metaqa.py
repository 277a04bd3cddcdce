"""Build the embedded ``mini-metaqa`` benchmark from its hand-written movie YAML.

The output follows MetaQA's official layout, so the regular MetaQA readers load it::

    kb.txt                                  head|relation|tail, one triple a line
    {k}-hop/vanilla/qa_{train,dev,test}.txt question with [topic]<TAB>ans1|ans2
    {k}-hop/qa_{train,dev,test}_qtype.txt   the qtype chain of the same line

Questions come from templates written in MetaQA's style; answers come from walking the
KB with set semantics per hop, and (MetaQA's convention, which the evaluation also
applies to predictions) the topic entity is removed from the final answer set only.
Each (topic, qtype) pair yields at most one question and lands in exactly one split,
so no pair is shared between train and an evaluation split. Output is a pure function
of the source and the seed.
"""

from __future__ import annotations

import argparse
import itertools
import random
from pathlib import Path
from typing import Any

import yaml

from cbr2.data.questions import METAQA_TYPES

YAML_KEYS = {
    # qtype token -> key of the movie entry in the YAML source
    "director": "directors", "writer": "writers", "actor": "actors", "year": "year",
    "language": "languages", "tags": "tags", "genre": "genres", "imdbvotes": "votes", "imdbrating": "rating",
}
# qtype token -> (KB relation, YAML key); the relation comes from the one table the readers use.
TYPES = {token: (METAQA_TYPES[token], key) for token, key in YAML_KEYS.items()}
SIZES = {"train": 500, "dev": 100, "test": 150}
MAX_ANSWERS = 30
SOURCE = Path(__file__).resolve().parents[1] / "sources" / "mini_metaqa_movies.yaml"
"""The hand-written movie YAML shipped with the package."""
FORBIDDEN = ("|", "[", "]", "\t", "\n", "\r")
PEOPLE = ("director", "writer", "actor")
ATTRS = ("year", "language", "genre")

# ----------------------------------------------------------------------------- templates
# "{t}" marks the topic; the builder writes it as "[topic]".
HOP1 = {
    "movie_to_director": ["who directed {t}", "who was the director of the film {t}",
                          "{t} was directed by which person", "which filmmaker directed the movie {t}"],
    "movie_to_writer": ["who wrote {t}", "who wrote the screenplay of the movie {t}",
                        "the film {t} was written by whom", "which screenwriter is credited on {t}"],
    "movie_to_actor": ["who starred in {t}", "which actors appear in the film {t}",
                       "who acted in the movie {t}", "the movie {t} starred which actors"],
    "movie_to_year": ["when was {t} released", "what year did the film {t} come out",
                      "in which year was the movie {t} released", "what is the release year of {t}"],
    "movie_to_language": ["what language is {t} in", "what is the spoken language of the film {t}",
                          "which language is the movie {t} in"],
    "movie_to_genre": ["what genre is {t}", "what kind of film is {t}",
                       "the movie {t} belongs to which genre", "what type of movie is {t}"],
    "movie_to_tags": ["what words describe {t}", "which topics is the film {t} about",
                      "describe the movie {t} in a few words", "what tags are attached to {t}"],
    "movie_to_imdbvotes": ["how well known is the film {t}", "what is the imdb popularity of {t}",
                           "how many imdb votes did the movie {t} get"],
    "movie_to_imdbrating": ["how is {t} rated", "what is the imdb rating of the film {t}",
                            "how did viewers rate the movie {t}"],
    "director_to_movie": ["what films did {t} direct", "{t} directed which movies",
                          "which movies were directed by {t}", "what has {t} directed"],
    "writer_to_movie": ["what films did {t} write", "{t} wrote the screenplay for which movies",
                        "which movies was {t} a writer on", "name a film written by {t}"],
    "actor_to_movie": ["what films did {t} star in", "{t} appears in which movies",
                       "which movies did {t} act in", "what has {t} starred in"],
    "year_to_movie": ["which movies were released in {t}", "what films came out in {t}",
                      "name the movies released in the year {t}"],
    "language_to_movie": ["which movies are in {t}", "what films are in the {t} language",
                          "which films were made in {t}"],
    "tags_to_movie": ["which movies are about {t}", "what films can be described by {t}",
                      "which movies are tagged with {t}"],
    "genre_to_movie": ["which movies are {t} films", "what films fall under the genre {t}",
                       "name some {t} movies"],
}

# Multi-hop questions = a question about a set of movies ({np}) whose phrase names the topic.
ASK = {
    "director": ["who directed {np}", "{np} were directed by whom", "which people directed {np}"],
    "writer": ["who wrote {np}", "{np} were written by whom", "who are the screenwriters of {np}"],
    "actor": ["who acted in {np}", "{np} starred which actors", "who appears in {np}"],
    "year": ["when were {np} released", "{np} came out in which years", "what are the release years of {np}"],
    "language": ["what languages are {np} in", "{np} are in which languages",
                 "what are the spoken languages of {np}"],
    "genre": ["what genres are {np}", "{np} belong to which genres", "which genres do {np} fall under"],
}
BY_PERSON = {  # X_to_movie as a noun phrase
    "director": ["the movies directed by {t}", "the films that {t} directed", "the {t} directed films"],
    "writer": ["the movies written by {t}", "the films that {t} wrote", "the {t} written films"],
    "actor": ["the movies starring {t}", "the films that {t} acted in", "the {t} starred movies"],
}
SHARING = {  # movie_to_X_to_movie as a noun phrase
    "director": ["the films that share a director with {t}", "the movies made by the director of {t}",
                 "the films whose director also directed {t}"],
    "writer": ["the movies that share a screenwriter with {t}", "the films written by the writer of {t}",
               "the movies whose writers also wrote {t}"],
    "actor": ["the films that share actors with {t}", "the movies starring the actors of {t}",
              "the films whose cast also appears in {t}"],
}
HOP2_SPECIAL = {
    "actor_to_movie_to_actor": ["who co-starred with {t}", "which actors appeared in a movie with {t}",
                                "the actor {t} acted alongside whom"],
    "director_to_movie_to_director": ["who co-directed films with {t}", "which directors made movies together with {t}",
                                      "the director {t} shared directing credits with whom"],
    "writer_to_movie_to_writer": ["who co-wrote movies with {t}", "which screenwriters wrote films together with {t}",
                                  "the writer {t} shared writing credits with whom"],
    "movie_to_director_to_movie": ["which movies share a director with {t}", "the director of {t} also made which films",
                                   "what other films were directed by the director of {t}"],
    "movie_to_writer_to_movie": ["which films share a screenwriter with {t}", "the writer of {t} also wrote which movies",
                                 "what other movies did the writer of {t} write"],
    "movie_to_actor_to_movie": ["which movies share an actor with {t}", "the actors of {t} also appear in which films",
                                "what other films feature the cast of {t}"],
}


def _templates(hop: int) -> dict[str, list[tuple[str, ...]]]:
    """qtype -> template options; a multi-hop option is a (question, noun phrase) pair."""
    if hop == 1:
        return {q: [(t,) for t in ts] for q, ts in HOP1.items()}
    out: dict[str, list[tuple[str, ...]]] = {}
    if hop == 2:
        out.update({q: [(t,) for t in ts] for q, ts in HOP2_SPECIAL.items()})
        for x in PEOPLE:
            for y in PEOPLE + ATTRS:
                if x != y:
                    out[f"{x}_to_movie_to_{y}"] = [(a, n) for a in ASK[y] for n in BY_PERSON[x]]
    else:
        for x in PEOPLE:
            for y in PEOPLE + ATTRS:
                if x != y:  # MetaQA's 3-hop types never repeat the middle type at the end
                    out[f"movie_to_{x}_to_movie_to_{y}"] = [(a, n) for a in ASK[y] for n in SHARING[x]]
    return out


# ----------------------------------------------------------------------------- the KB
def load_movies(source: str | Path) -> list[dict[str, Any]]:
    """Read and check the movie YAML.

    Raises:
        ValueError: On a missing field, a forbidden character, a duplicate title, or a title
            that equals (case-insensitively) another kind of entity, which would make
            MetaQA's name-keyed KB merge two entities.
    """
    movies = yaml.safe_load(Path(source).read_text(encoding="utf-8"))["movies"]
    titles: set[str] = set()
    others: set[str] = set()
    for i, m in enumerate(movies):
        for key in ["title"] + [k for _, k in TYPES.values()]:
            if key not in m:
                raise ValueError(f"movies[{i}] ({m.get('title')!r}): missing {key!r}")
        for name in [m["title"], *(str(v) for v in _values(m))]:
            if not name.strip() or any(c in name for c in FORBIDDEN):
                raise ValueError(f"movies[{i}]: bad name {name!r}")
        if m["title"] in titles:
            raise ValueError(f"duplicate title {m['title']!r}")
        titles.add(m["title"])
        others.update(str(v).casefold() for v in _values(m))
    clash = sorted(t for t in titles if t.casefold() in others)
    if clash:
        raise ValueError(f"titles equal to other entity names: {clash}")
    return movies


def _values(movie: dict[str, Any]) -> list[Any]:
    return [v for _, key in TYPES.values() for v in (movie[key] if isinstance(movie[key], list) else [movie[key]])]


def kb_triples(movies: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(head, relation, tail) triples in YAML order, duplicates dropped."""
    out: dict[tuple[str, str, str], None] = {}
    for m in movies:
        for rel, key in TYPES.values():
            for v in m[key] if isinstance(m[key], list) else [m[key]]:
                out[(m["title"], rel, str(v))] = None
    return list(out)


class MovieKB:
    """Forward and backward indexes of the triples, for walking qtype chains."""

    def __init__(self, triples: list[tuple[str, str, str]]):
        self.fwd: dict[tuple[str, str], set[str]] = {}
        self.bwd: dict[tuple[str, str], set[str]] = {}
        self.tails: dict[str, set[str]] = {}
        self.movies: set[str] = set()
        for h, r, t in triples:
            self.fwd.setdefault((h, r), set()).add(t)
            self.bwd.setdefault((t, r), set()).add(h)
            self.tails.setdefault(r, set()).add(t)
            self.movies.add(h)

    def topics(self, token: str) -> list[str]:
        """Every entity a qtype starting with ``token`` can ask about."""
        return sorted(self.movies if token == "movie" else self.tails[TYPES[token][0]])

    def walk(self, topic: str, qtype: str) -> list[set[str]]:
        """The entity set after each hop of ``qtype`` (set semantics, no topic removal)."""
        tokens = qtype.split("_to_")
        frontier, sets = {topic}, []
        for a, b in itertools.pairwise(tokens):
            if a == "movie":
                rel, index = TYPES[b][0], self.fwd
            else:
                rel, index = TYPES[a][0], self.bwd
            frontier = set().union(*(index.get((e, rel), set()) for e in frontier))
            sets.append(frontier)
        return sets

    def answer(self, topic: str, qtype: str) -> list[str]:
        """Sorted answers of (topic, qtype): the last hop's set without the topic."""
        return sorted(self.walk(topic, qtype)[-1] - {topic})


def _candidate(kb: MovieKB, topic: str, qtype: str) -> list[str] | None:
    """The answers if the pair makes a sensible question, else None.

    Intermediate hops must reach something besides the topic (otherwise "films that share
    a director with X" would be about X alone), and the answer must be non-empty and at
    most ``MAX_ANSWERS`` long (MetaQA-style lists, not "every English film").
    """
    sets = kb.walk(topic, qtype)
    if any(not (s - {topic}) for s in sets):
        return None
    answers = sorted(sets[-1] - {topic})
    return answers if 0 < len(answers) <= MAX_ANSWERS else None


# ----------------------------------------------------------------------------- questions
def _select(kb: MovieKB, templates: dict[str, list], rng: random.Random) -> list[tuple[str, str, list[str]]]:
    """Pick up to sum(SIZES) (topic, qtype, answers), round-robin over qtypes for balance."""
    pools = []
    for qtype in sorted(templates):
        pool = [(t, qtype, a) for t in kb.topics(qtype.split("_to_")[0])
                if (a := _candidate(kb, t, qtype)) is not None]
        rng.shuffle(pool)
        pools.append(pool)
    picked, total = [], sum(SIZES.values())
    for i in range(max(map(len, pools), default=0)):
        for pool in pools:
            if i < len(pool) and len(picked) < total:
                picked.append(pool[i])
    return picked


def _phrase(topic: str, options: list[tuple[str, ...]], rng: random.Random) -> str:
    choice = rng.choice(options)
    text = choice[0] if len(choice) == 1 else choice[0].replace("{np}", choice[1])
    return text.replace("{t}", f"[{topic}]")


def build_mini_metaqa(source: str | Path, out_dir: str | Path, seed: int = 0) -> dict[str, Any]:
    """Write ``kb.txt`` and the 1/2/3-hop question and qtype files into ``out_dir``.

    Args:
        source: The movie YAML (``cbr2/data/sources/mini_metaqa_movies.yaml``).
        out_dir: Target folder; created if missing, files overwritten.
        seed: Seed of the only random generator; the same seed gives byte-identical files.

    Returns:
        ``{"kb_triples": n, "hops": {"1-hop": {"train": n, "dev": n, "test": n,
        "qtypes": [...]}, ...}}``.
    """
    out = Path(out_dir)
    triples = kb_triples(load_movies(source))
    out.mkdir(parents=True, exist_ok=True)
    _write(out / "kb.txt", [f"{h}|{r}|{t}" for h, r, t in triples])
    kb = MovieKB(triples)
    stats: dict[str, Any] = {"kb_triples": len(triples), "hops": {}}
    for hop in (1, 2, 3):
        rng = random.Random(f"{seed}-{hop}")  # one stream per hop: hops do not perturb each other
        templates = _templates(hop)
        picked = _select(kb, templates, rng)
        rng.shuffle(picked)
        # Fewer candidates than wanted: shrink every split in proportion.
        scale = min(1.0, len(picked) / sum(SIZES.values()))
        n_test, n_dev = round(SIZES["test"] * scale), round(SIZES["dev"] * scale)
        splits = {"test": picked[:n_test], "dev": picked[n_test:n_test + n_dev], "train": picked[n_test + n_dev:]}
        hop_stats: dict[str, Any] = {}
        for split in ("train", "dev", "test"):
            rows = splits[split]
            lines = [f"{_phrase(t, templates[q], rng)}\t{'|'.join(a)}" for t, q, a in rows]
            _write(out / f"{hop}-hop" / "vanilla" / f"qa_{split}.txt", lines)
            _write(out / f"{hop}-hop" / f"qa_{split}_qtype.txt", [q for _, q, _ in rows])
            hop_stats[split] = len(rows)
        hop_stats["qtypes"] = sorted({q for _, q, _ in picked})
        stats["hops"][f"{hop}-hop"] = hop_stats
    return stats


def _write(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8", newline="\n")


def main(argv: list[str] | None = None) -> None:
    """CLI: ``python -m cbr2.data.builders.mini_metaqa OUT_DIR [--source YAML] [--seed N]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?", default=str(SOURCE.parents[1] / "embedded" / "mini-metaqa"))
    parser.add_argument("--source", default=str(SOURCE))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    stats = build_mini_metaqa(args.source, args.out_dir, args.seed)
    print(f"{stats['kb_triples']} triples -> {args.out_dir}")
    for hop, s in stats["hops"].items():
        print(f"{hop}: train {s['train']}, dev {s['dev']}, test {s['test']}, {len(s['qtypes'])} qtypes")


if __name__ == "__main__":
    main()

"""Linking: the KB entities and concepts a question names, and the literal values it states.

Input is the question text and the KB only (never a gold program). The output, ``Links``,
feeds three places: the prompt (the question's own entities and values, shown apart from the
retrieved context), knowledge retrieval (facts of the linked entities first) and grounded
decoding (``cbr2.generation.grounded``: ``Find`` arguments and literal values drawn from it).

Method. Names are split into word and punctuation tokens and lower-cased; every name becomes a
key of one dictionary (its token tuple → its KB spellings). A question is matched by looking up
each of its token n-grams up to the longest name's length: O(question tokens × longest name)
hash lookups, independent of the KB's size, and a build that is one pass over the names
(``benchmarks/scale.py`` measures both at KQA Pro size). An Aho-Corasick automaton would do the
same scan; the n-gram table needs no extra package and is as fast at these lengths.

Which matches count:

- MetaQA marks the topic entity in brackets (``what films did [Jason Flemyng] star in``): a
  question with brackets links the bracketed names only, case-insensitively.
- Otherwise an entity match must have the question's own casing (``Mount Fuji``, not ``mount
  fuji`` inside a sentence), except for the question's first word, whose capital says nothing;
  a question written in lower case only is matched case-insensitively. Of nested matches the
  longest wins (``Paris, Texas`` over ``Texas``); single stop words and bare numbers are not
  entities.
- Concepts match case-insensitively, also in the plural (``rivers`` → ``river``).
- Values: numbers (``7,800,000`` → ``7800000``), a number followed by a unit the KB uses
  (``3715 metre``), years, dates in ISO or written form (``1 January 1980`` → ``1980-01-01``),
  quoted strings and the KB's string attribute values the question contains.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

from cbr2.kb.model import KB, format_number

_TOKEN = re.compile(r"\w+|[^\w\s]", re.UNICODE)
_BRACKETS = re.compile(r"\[([^\[\]]+)\]")
_NUMBER = re.compile(r"(?<![\w.-])-?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w-])|(?<![\w.-])-?\d+(?:\.\d+)?(?![\w-])")
_QUOTED = re.compile(r"[\"“]([^\"”]{1,60})[\"”]")
_MONTHS = {m: i for i, m in enumerate(("january", "february", "march", "april", "may", "june", "july", "august",
                                        "september", "october", "november", "december"), start=1)}
_MONTH = "|".join(_MONTHS)
_DATES = (
    (re.compile(r"\b(\d{3,4})[-/](\d{1,2})[-/](\d{1,2})\b"), ("y", "m", "d")),
    (re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)? (?:of )?({_MONTH}),? (\d{{3,4}})\b", re.IGNORECASE), ("d", "M", "y")),
    (re.compile(rf"\b({_MONTH}) (\d{{1,2}})(?:st|nd|rd|th)?,? (\d{{3,4}})\b", re.IGNORECASE), ("M", "d", "y")),
)
STOP_WORDS = frozenset(
    ["a", "an", "the", "of", "in", "on", "at", "to", "for", "from", "by", "with", "and", "or", "is", "are", "was", "were", "be", "been", "it", "its", "this", "that", "these", "those", "what", "which", "who", "whom", "whose", "when", "where", "how", "many", "much", "than", "as", "more", "less", "most", "least", "has", "have", "had", "did", "do", "does", "not", "no", "yes", "one"])
"""Words that are never an entity mention on their own (a KB may still have an item so named)."""

VALUE_KINDS = ("quantity", "year", "date", "string")


def tokens(text: str) -> list[tuple[str, int, int]]:
    """``(token, start, end)`` of each word or punctuation token of ``text``."""
    return [(m.group(), m.start(), m.end()) for m in _TOKEN.finditer(text)]


def _key(text: str) -> tuple[str, ...]:
    return tuple(t.lower() for t, _, _ in tokens(text))


def _plurals(name: str) -> set[str]:
    """``name`` and its English plural forms (on the last word)."""
    forms = {name, name + "s", name + "es"}
    if name.endswith("y"):
        forms.add(name[:-1] + "ies")
    return forms


@dataclass(frozen=True)
class Links:
    """What linking found in one question, in question order.

    Attributes:
        entities: KB entity names.
        concepts: KB concept names.
        values: Literal kind (``quantity``, ``year``, ``date``, ``string``) → values as a
            program writes them.
    """

    entities: tuple[str, ...] = ()
    concepts: tuple[str, ...] = ()
    values: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def all_values(self) -> list[str]:
        """Every linked value, each once, in kind order."""
        return list(dict.fromkeys(v for kind in VALUE_KINDS for v in self.values.get(kind, ())))

    def to_record(self) -> dict:
        """The JSON form (``retrieval.jsonl``)."""
        return {"entities": list(self.entities), "concepts": list(self.concepts),
                "values": {k: list(v) for k, v in self.values.items() if v}}


class Linker:
    """Links questions against one KB (see the module docstring for the method).

    Args:
        kb: The knowledge base; its entity and concept names, units and string values are read once.
    """

    def __init__(self, kb: KB):
        self.entities: dict[tuple[str, ...], set[str]] = defaultdict(set)
        self.concepts: dict[tuple[str, ...], str] = {}
        self.strings: dict[tuple[str, ...], set[str]] = defaultdict(set)
        concept_names = {c["name"] for c in kb.concepts.values()}
        self.entity_type: dict[str, str] = {}
        """Entity name → the name of its first concept (what ``mask`` writes in its place)."""
        units: set[str] = set()
        for ent in kb.entities.values():
            self.entities[_key(ent["name"])].add(ent["name"])
            concept = kb.concepts.get(next(iter(ent.get("instanceOf") or ()), None))
            if concept and ent["name"] not in self.entity_type:
                self.entity_type[ent["name"]] = concept["name"]
            for fact in (*ent.get("attributes", []), *ent.get("relations", [])):
                for value in (fact.get("value"), *(v for vs in fact.get("qualifiers", {}).values() for v in vs)):
                    if value is None:
                        continue
                    if value["type"] == "string":
                        self.strings[_key(str(value["value"]))].add(str(value["value"]))
                    elif value["type"] == "quantity" and value.get("unit", "1") != "1":
                        units.add(value["unit"])
        for name in concept_names:
            for form in _plurals(name):
                self.concepts.setdefault(_key(form), name)
        self.entities.pop((), None)
        self.strings.pop((), None)
        # Units as token tuples, longest first, so "square kilometre" wins over "kilometre".
        self.units = sorted((_key(u) + (u,) for u in units), key=len, reverse=True)
        self.longest = max((len(k) for k in (*self.entities, *self.concepts, *self.strings)), default=1)

    def link(self, question: str) -> Links:
        """The entities, concepts and values of one question."""
        return self._link(question)[0]

    def mask(self, question: str) -> str:
        """The question with each linked entity and value replaced by its type in brackets.

        ``what films did [Jason Flemyng] star in`` → ``what films did [person] star in``;
        ``Which rivers are longer than 3715 km?`` keeps ``rivers`` (a concept says what is asked)
        and writes ``[quantity]`` for the number. Two questions of one template about different
        items then read alike, which is what the semantic case view should compare: without
        masking, its nearest questions are often about the same item with another program.
        An entity's type is its first concept in the KB (``entity`` when it has none).
        """
        _, spans = self._link(question)
        out, end = [], 0
        for start, stop, label in sorted(spans):
            if start < end:
                continue  # nested in a span already replaced
            out += [question[end:start], f"[{label}]"]
            end = stop
        return "".join(out) + question[end:]

    def _link(self, question: str) -> tuple[Links, list[tuple[int, int, str]]]:
        """The links of one question and the mention spans ``(start, end, type)`` they came from."""
        toks = tokens(question)
        values, taken, value_spans = self._values(question, toks)
        bracketed = list(_BRACKETS.finditer(question))
        if bracketed:
            entity_spans = [(m.start(), m.end(), sorted(self.entities.get(_key(m.group(1)), ()))) for m in bracketed]
            entity_spans = [s for s in entity_spans if s[2]]
        else:
            entity_spans = self._names(question, toks, self.entities, taken)
        entities = [n for _, _, keep in entity_spans for n in keep]
        concept_spans = self._matches(toks, self.concepts, self.longest)
        concepts = [name for _, _, name in concept_spans]
        # A string value is not part of a concept's or an entity's name ("basketball team").
        taken = taken + [(s, e) for s, e, _ in concept_spans]
        string_spans = [(s, e) for s, e, _ in _maximal(
            [(s, e, v) for s, e, v in self._matches(toks, self.strings, self.longest)
             if _plausible(question, s, e, taken) and (question[s:e] in v or not _cased(question))])
            if question[s:e] not in entities]
        string_spans += [m.span(1) for m in _QUOTED.finditer(question)]
        values["string"] = tuple(dict.fromkeys(question[s:e].strip() for s, e in string_spans))
        spans = [(s, e, self.entity_type.get(keep[0], "entity")) for s, e, keep in entity_spans]
        spans += value_spans + [(s, e, "text") for s, e in string_spans]
        return Links(tuple(dict.fromkeys(entities)), tuple(dict.fromkeys(concepts)), values), spans

    @staticmethod
    def _matches(toks: list[tuple[str, int, int]], table: dict, longest: int) -> list[tuple[int, int, object]]:
        """``(start char, end char, table value)`` of every token n-gram found in ``table``."""
        low = [t.lower() for t, _, _ in toks]
        found = []
        for i in range(len(toks)):
            for n in range(1, min(longest, len(toks) - i) + 1):
                hit = table.get(tuple(low[i:i + n]))
                if hit is not None:
                    found.append((toks[i][1], toks[i + n - 1][2], hit))
        return found

    def _names(self, question: str, toks: list[tuple[str, int, int]], table: dict,
               taken: list[tuple[int, int]]) -> list[tuple[int, int, list[str]]]:
        """Entity matches ``(start, end, names)`` outside the value spans ``taken``, longest of nested ones."""
        cased = _cased(question)
        spans = []
        for start, end, names in self._matches(toks, table, self.longest):
            text = question[start:end]
            if not _plausible(question, start, end, taken):
                continue
            if cased:
                # The question's own casing decides; only a sentence-initial capital is ignored.
                keep = sorted(n for n in names if n == text
                              or (start == 0 and n[:1].lower() + n[1:] == text[:1].lower() + text[1:]))
            else:
                keep = sorted(names)
            if keep:
                spans.append((start, end, keep))
        return _maximal(spans)

    def _values(self, question: str, toks: list[tuple[str, int, int]]
                ) -> tuple[dict[str, tuple[str, ...]], list[tuple[int, int]], list[tuple[int, int, str]]]:
        """Quantities, years and dates, the character spans they cover, and those spans typed."""
        quantities, years, dates, taken, typed = [], [], [], [], []
        for pattern, order in _DATES:
            for m in pattern.finditer(question):
                parts = dict(zip(order, m.groups(), strict=True))
                month = _MONTHS[parts["M"].lower()] if "M" in parts else int(parts["m"])
                day, year = int(parts["d"]), int(parts["y"])
                if 1 <= month <= 12 and 1 <= day <= 31:
                    dates.append(f"{year:04d}-{month:02d}-{day:02d}")
                    taken.append(m.span())
                    typed.append((*m.span(), "date"))
        low = [t.lower() for t, _, _ in toks]
        for m in _NUMBER.finditer(question):
            if any(a <= m.start() and m.end() <= b for a, b in taken):
                continue  # a part of a date
            number = format_number(float(m.group().replace(",", "")))
            if "." in m.group() and "." not in number:
                number = m.group().replace(",", "")  # keep a written decimal as written
            # A unit the KB uses right after the number: the quantity is written with it.
            end, unit = m.end(), None
            after = [i for i, (_, s, _) in enumerate(toks) if s >= m.end()]
            if after:
                i = after[0]
                unit = next((u for u in self.units if tuple(low[i:i + len(u) - 1]) == u[:-1]), None)
                if unit:
                    end = toks[i + len(unit) - 2][2]
            quantities.append(f"{number} {unit[-1]}" if unit else number)
            year = not unit and re.fullmatch(r"\d{1,4}", m.group())
            if year:
                years.append(m.group())
            taken.append((m.start(), end))
            typed.append((m.start(), end, "year" if year and len(m.group()) == 4 else "quantity"))
        values = {"quantity": tuple(dict.fromkeys(quantities)), "year": tuple(dict.fromkeys(years)),
                  "date": tuple(dict.fromkeys(dates))}
        return values, taken, typed


def _cased(question: str) -> bool:
    """Whether the question is written with capitals at all (MetaQA's are lower case only)."""
    return any(ch.isupper() for ch in question)


def _plausible(question: str, start: int, end: int, taken: list[tuple[int, int]]) -> bool:
    """A name match that is not a stop word, a bare number or part of a value span."""
    text = question[start:end]
    if text.lower() in STOP_WORDS or text.replace(",", "").replace(".", "").isdigit():
        return False
    return not any(a <= start and end <= b for a, b in taken)


def _maximal(spans: list[tuple]) -> list[tuple]:
    """The spans ``(start, end, ...)`` not strictly inside a longer one, in question order."""
    return sorted((s for s in spans if not any(o[0] <= s[0] and s[1] <= o[1] and o[1] - o[0] > s[1] - s[0]
                                               for o in spans)), key=lambda s: s[0])


def question_spans(question: str, max_words: int = 8) -> list[str]:
    """Every run of up to ``max_words`` consecutive word tokens of ``question``, as written there
    (punctuation inside a run is kept: ``Niger-Congo``; runs do not start or end with it)."""
    toks = tokens(question)
    words = [i for i, (t, _, _) in enumerate(toks) if t[0].isalnum() or t[0] == "_"]
    spans = []
    for a, i in enumerate(words):
        for j in words[a:a + max_words]:
            if toks[j][1] - toks[i][1] > 80:
                break
            spans.append(question[toks[i][1]:toks[j][2]])
    return list(dict.fromkeys(spans))

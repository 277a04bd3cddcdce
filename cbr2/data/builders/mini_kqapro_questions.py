"""Question generator of the embedded ``mini-kqapro`` benchmark.

Builds KQA Pro-style items (question, KoPL program, 10 choices, answer) over any KB in the
newer official ``kb.json`` schema. Nothing about the KB is hard-coded: concepts, attribute
keys with their value kinds and units, relations and qualifier keys are all read from the
KB dict. A program is composed from *descriptions* (of one entity, or of a set of
entities) plus a final step that fixes its category; it is run through the supplied
executor and kept only when it yields exactly one answer, so every gold answer comes from
execution, never from reasoning about the KB here.
"""

from __future__ import annotations

import datetime as dt
import random
import re
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from cbr2.data.questions import KQAPRO_CATEGORIES
from cbr2.kb.model import format_value
from cbr2.kopl.program import Program
from cbr2.kopl.program import Step as ProgramStep
from cbr2.kopl.sketch import sketch_text

Execute = Callable[[list[dict]], object]
Step = tuple[str, list[str]]

CATEGORIES = KQAPRO_CATEGORIES
# Category sizes of the official KQA Pro validation set; train follows this mix.
KQAPRO_MIX = {"QueryRelation": 1786, "SelectBetween": 1604, "QueryName": 1458, "Verify": 1447,
              "QueryAttr": 1418, "Count": 1318, "QueryAttrQualifier": 1214,
              "QueryRelationQualifier": 1004, "SelectAmong": 548}
FILTER = {"string": "FilterStr", "quantity": "FilterNum", "year": "FilterYear", "date": "FilterDate"}
VERIFY = {"string": "VerifyStr", "quantity": "VerifyNum", "year": "VerifyYear", "date": "VerifyDate"}

# (relative-clause form, verb-phrase form) of a comparison, per value kind and op.
CMP = {
    "string": {"=": ("", "of ")},
    "quantity": {"=": ("", "of "), ">": ("greater than ", "greater than "),
                 "<": ("less than ", "less than "), "!=": ("not ", "other than ")},
    "year": {"=": ("in ", "in "), "<": ("before ", "before "), ">": ("after ", "after "),
             "!=": ("not in ", "not in ")},
    "date": {"=": ("", "on "), "<": ("before ", "before "), ">": ("after ", "after "),
             "!=": ("not ", "not on ")},
}
# Relation names ending in one of these read as verbs or participles ("educated at").
PREPOSITIONS = {"at", "in", "with", "by", "for", "to", "from", "on", "of", "after", "into", "as"}
# Question templates per category; a template's index is its phrasing id.
TEMPLATES = {
    "Count": ["How many {cs} {vp}?", "What is the number of {pl}?", "How many {pl} are there?",
              "Count the {pl}."],
    "QueryName": ["What is {sg}?", "Which {c} {vp}?", "Tell me {sg}.", "Identify {sg}."],
    "QueryAttr": ["What is the {k} of {sg}?", "What {k} does {sg} have?",
                  "For {sg}, what is the {k}?", "Tell me the {k} of {sg}."],
    "QueryAttrQualifier": ["What is the {qk} for the {k} of {sg} being {v}?",
                           "The {k} of {sg} is {v}: what is the {qk} of this statement?",
                           "For {sg}, whose {k} is {v}, what is the {qk}?",
                           "Regarding the {k} {v} of {sg}, what is its {qk}?"],
    "QueryRelation": ["How is {a} related to {b}?", "What is the relation from {a} to {b}?",
                      "What is the relationship between {a} and {b}?",
                      "In what way is {a} connected to {b}?"],
    "QueryRelationQualifier": ["What is the {qk} of the fact that {stmt}?",
                               "Given that {stmt}, what is the {qk}?",
                               "Regarding the statement that {stmt}, what is the {qk}?",
                               "In the {r} relation between {a} and {b}, what is the {qk}?"],
    "SelectAmong": ["Which {c} has the {most} {k} among {pl}?",
                    "Among {pl}, which one has the {most} {k}?",
                    "Of all {pl}, which has the {most} {k}?",
                    "What is the {c} with the {most} {k} among {pl}?"],
    "SelectBetween": ["Which has {a_more} {k}, {a} or {b}?",
                      "Between {a} and {b}, which one has the {more} {k}?",
                      "Of {a} and {b}, which has the {more} {k}?",
                      "Does {a} or {b} have the {more} {k}?"],
    "Verify": ["Is the {k} of {sg} {cmp}{v}{when}?", "Does {sg} have {a_k} {cmpvp}{v}{when}?",
               "Is it true that the {k} of {sg} is {cmp}{v}{when}?",
               "Would it be right to say that {sg} has {a_k} {cmpvp}{v}{when}?"],
}
MORE = {"greater": ("greater", "larger", "higher"), "less": ("smaller", "lower")}
MOST = {"largest": ("largest", "highest", "greatest"), "smallest": ("smallest", "lowest")}
# Entity-description kinds; "name" (a bare Find) is repeated to weigh it as KQA Pro does.
ENTITY_KINDS = ("name", "name", "name", "str", "num", "year", "date", "rel", "relq", "and")
SET_KINDS = ("concept", "str", "num", "year", "date", "rel", "relq", "relattr", "and", "or")
IRREGULAR = {"person": "people", "man": "men", "woman": "women", "child": "children", "volcano": "volcanoes",
             "hero": "heroes", "series": "series", "species": "species"}


def _plural(noun: str) -> str:
    """Plural of a concept name; the head noun is the last word before any " of "."""
    head, sep, tail = noun.partition(" of ")
    words = head.split()
    last = words[-1]
    if last in IRREGULAR:
        last = IRREGULAR[last]
    elif last.endswith("y") and last[-2:-1] not in tuple("aeiou"):
        last = last[:-1] + "ies"
    elif last.endswith(("s", "x", "z", "ch", "sh")):
        last += "es"
    else:
        last += "s"
    return " ".join(words[:-1] + [last]) + sep + tail


def _a(phrase: str) -> str:
    return ("an " if phrase[:1].lower() in "aeiou" else "a ") + phrase


def _agree(text: str, plural: bool) -> str:
    """Fill the agreement tokens (``{is}``, ``{has}``, ``{one}``, ``{-s}``) of a phrase."""
    forms = {"{is}": ("is", "are"), "{has}": ("has", "have"), "{one}": ("one", "ones"), "{-s}": ("s", "")}
    for token, pair in forms.items():
        text = text.replace(token, pair[plural])
    return text


def _rel_text(r: str, o: str, d: str) -> tuple[str, str]:
    """(relative clause, verb phrase) saying how an entity relates to ``o`` by relation ``r``.

    ``d`` is the Relate direction taken from ``o``: "forward" reaches x with ``o r x``,
    "backward" x with ``x r o``. KQA Pro relation names are nouns ("director"), participles
    or verbs with a preposition ("educated at", "shares border with"), or a noun plus a
    participle ("award received"); each reads best in a different frame.
    """
    words = r.split()
    first, last = words[0], words[-1]
    if first in ("has", "contains") or (first.endswith("s") and last in PREPOSITIONS):
        verb = " ".join(["{has}" if first == "has" else first[:-1] + "{-s}"] + words[1:])
        return ((f"that {verb} {o}", f"{verb} {o}") if d == "backward" else
                (f"that {o} {r}", f"{{is}} the {{one}} {o} {r}"))
    if len(words) > 1 and last.endswith("ed") and last not in PREPOSITIONS:  # "award received"
        return ((f"that {last} {o}", f"{last} {o}") if d == "backward" else
                (f"that {o} {last}", f"{{is}} the {{one}} {o} {last}"))
    if last in PREPOSITIONS or (first.endswith("ed") and len(words) > 1 and words[1] in PREPOSITIONS):
        return ((f"that {{is}} {r} {o}", f"{{is}} {r} {o}") if d == "backward" else
                (f"that {o} is {r}", f"{{is}} the {{one}} {o} is {r}"))
    return ((f"whose {r} is {o}", f"{{has}} {o} as {r}") if d == "backward" else
            (f"that {{is}} the {r} of {o}", f"{{is}} the {r} of {o}"))


def _kind(value: dict) -> str:
    return value["type"] if value["type"] in FILTER else "string"


_fmt = format_value  # a KB value as KQA Pro writes it in inputs and answers


def _year(text: str) -> str:
    return text.split("-")[0]


def _program(steps: list[Step]) -> list[dict]:
    """Post-order steps with KQA Pro dependencies, as the engine's branch stack implies."""
    bare = Program(tuple(ProgramStep(fn, tuple(inputs)) for fn, inputs in steps))
    deps = bare.branch_stack_dependencies()
    return Program(tuple(ProgramStep(s.function, s.inputs, d) for s, d in zip(bare.steps, deps))).to_json()


def _sketch(program: list[dict]) -> str:
    return sketch_text(Program.from_json(program))


@dataclass
class Cond:
    """One condition on entities: its steps and its text (with agreement tokens)."""

    steps: list[Step]
    clause: str  # relative clause: "whose population is greater than 5"
    vp: str  # verb phrase: "{has} a population greater than 5"
    key: str = ""  # the attribute key filtered on, if any


@dataclass
class Desc:
    """A description of an entity or a set: the steps and the phrases that say it."""

    steps: list[Step]
    concept: str | None = None
    name: str | None = None  # set for a bare Find
    clause: str = ""
    vp: str = "exist"

    def sg(self) -> str:
        return self.name or f"the {self.concept} {_agree(self.clause, False)}".strip()

    def pl(self) -> str:
        return f"{_plural(self.concept)} {_agree(self.clause, True)}".strip()


class _Generator:
    """Reads the KB's schema once, then composes, executes and phrases questions."""

    def __init__(self, kb: dict, execute: Execute, rng: random.Random):
        self.execute, self.rng = execute, rng
        concepts, entities = kb["concepts"], kb["entities"]
        cname = {c: concepts[c]["name"] for c in sorted(concepts)}
        self.name = {e: entities[e]["name"] for e in sorted(entities)}
        # Find() resolves over concept and entity names together, so only unique names qualify.
        counts = Counter(list(cname.values()) + list(self.name.values()))
        self.findable = {e for e, n in self.name.items() if counts[n] == 1}
        ancestors = {c: self._ancestors(c, concepts) for c in cname}
        self.direct, self.members = {}, defaultdict(set)
        for e in sorted(entities):
            direct = [c for c in entities[e].get("instanceOf", []) if c in cname]
            self.direct[e] = sorted(cname[c] for c in direct)
            for c in set(direct).union(*[ancestors[c] for c in direct]):
                self.members[cname[c]].add(e)
        self.members = {c: sorted(m) for c, m in sorted(self.members.items())}
        # Broader concepts of each concept, narrowest first: fallbacks for distractor names.
        self.broader = {cname[c]: sorted((cname[a] for a in ancestors[c]), key=lambda n: len(self.members.get(n, [])))
                        for c in cname}
        # Value kinds per key over attributes and qualifiers: the engine keeps one table
        # for both, so a key seen with two kinds (year and date count as one) is unusable.
        kinds, self.values, self.attrs = defaultdict(set), defaultdict(set), defaultdict(list)
        self.links, self.facts = defaultdict(list), []
        for e in sorted(entities):
            for a in entities[e].get("attributes", []):
                self.attrs[e].append((a["key"], a["value"], a.get("qualifiers") or {}))
                self._note(a["key"], a["value"], kinds)
                for qk, qvs in sorted((a.get("qualifiers") or {}).items()):
                    for qv in qvs:
                        self._note(qk, qv, kinds)
            for r in entities[e].get("relations", []):
                for qk, qvs in sorted((r.get("qualifiers") or {}).items()):
                    for qv in qvs:
                        self._note(qk, qv, kinds)
                if r["direction"] == "forward" and r["object"] in entities:
                    self.facts.append((e, r["relation"], r["object"], r.get("qualifiers") or {}))
        group = {"string": "string", "quantity": "quantity", "year": "time", "date": "time"}
        self.key_kind = {k: group[min(ks)] for k, ks in sorted(kinds.items())}
        self.bad_keys = {k for k, ks in kinds.items() if len({group[x] for x in ks}) > 1}
        self.values = {k: sorted(v) for k, v in sorted(self.values.items()) if k not in self.bad_keys}
        self.attrs = {e: [a for a in al if a[0] not in self.bad_keys] for e, al in sorted(self.attrs.items())}
        for s, r, o, q in self.facts:
            # links[x]: ways to reach x by Find(other) -> Relate(r, direction).
            self.links[o].append((r, "forward", s, q))
            self.links[s].append((r, "backward", o, q))
        self.relations = sorted({r for _, r, _, _ in self.facts})
        self.qual_facts = [f for f in self.facts if self._quals(f[3])]
        self.described = [e for e in sorted(self.direct) if self.direct[e]]
        # Sets are described by concepts that some entity is directly an instance of, as
        # KQA Pro does ("cities", not "geographic locations").
        direct = {c for cs in self.direct.values() for c in cs}
        self.set_concepts = [c for c, m in self.members.items() if len(m) >= 3 and c in direct]
        qty = defaultdict(set)  # quantity key -> entities holding it
        for e, al in self.attrs.items():
            for k, v, _ in al:
                if v["type"] == "quantity":
                    qty[k].add(e)
        self.qty_keys = {k: sorted(es) for k, es in sorted(qty.items()) if len(es) >= 2}
        self.seen_programs, self.seen_questions = set(), set()
        self.tpl_use = defaultdict(Counter)
        self.answers = defaultdict(Counter)

    @staticmethod
    def _ancestors(c: str, concepts: dict) -> set:
        seen, todo = set(), list(concepts[c].get("subclassOf", []))
        while todo:
            p = todo.pop()
            if p in concepts and p not in seen:
                seen.add(p)
                todo.extend(concepts[p].get("subclassOf", []))
        return seen

    def _note(self, key: str, value: dict, kinds: dict) -> None:
        kinds[key].add(_kind(value))
        self.values[key].add(_fmt(value))

    def _quals(self, quals: dict) -> list[tuple[str, dict]]:
        return [(qk, qv) for qk in sorted(quals) if qk not in self.bad_keys for qv in quals[qk]]

    def _literal(self, value: dict, kind: str | None = None) -> tuple[str, str]:
        """(kind, input text) of a value; a date may be asked about by its year, half the time."""
        vk = kind or _kind(value)
        if kind is None and vk == "date" and self.rng.random() < 0.5:
            vk = "year"
        return vk, _year(_fmt(value)) if vk == "year" else _fmt(value)

    # ----------------------------------------------------------------- descriptions
    def _attr_cond(self, e: str, kind: str | None, ops=("=",), avoid: str | None = None) -> Cond | None:
        """FindAll -> Filter* on one of e's attribute values (``kind=None``: any kind)."""
        cands = [(k, v) for k, v, _ in self.attrs.get(e, []) if k != avoid and
                 (kind is None or _kind(v) == kind or (kind == "year" and v["type"] == "date"))]
        if not cands:
            return None
        k, v = self.rng.choice(cands)
        vk, text = self._literal(v, kind if kind in ("year", "date") else None)
        op = "=" if vk == "string" else self.rng.choice(ops)
        cmp, cmpvp = CMP[vk][op]
        inputs = [k, text] if vk == "string" else [k, text, op]
        vp = f"{{has}} the {k} {text}" if vk == "string" else f"{{has}} {_a(k)} {cmpvp}{text}"
        return Cond([("FindAll", []), (FILTER[vk], inputs)], f"whose {k} is {cmp}{text}", vp, k)

    def _rel_cond(self, e: str, qual: bool = False, shun: str | None = None) -> Cond | None:
        """Find(other) -> Relate reaching e, optionally narrowed by a qualifier (QFilter*);
        ``other`` is never ``shun`` (the entity a question pairs e with)."""
        cands = [x for x in self.links.get(e, []) if x[2] in self.findable and x[2] != shun
                 and (not qual or self._quals(x[3]))]
        if not cands:
            return None
        r, d, other, quals = self.rng.choice(cands)
        o = self.name[other]
        steps = [("Find", [o]), ("Relate", [r, d])]
        clause, vp = _rel_text(r, o, d)
        if qual:
            qk, qv = self.rng.choice(self._quals(quals))
            vk, text = self._literal(qv)
            op = "=" if vk == "string" else self.rng.choice(("=", "=", "<", ">"))
            steps.append(("Q" + FILTER[vk], [qk, text] if vk == "string" else [qk, text, op]))
            suffix = f" with {qk} {'' if vk == 'string' else CMP[vk][op][1]}{text}"
            clause, vp = clause + suffix, vp + suffix
        return Cond(steps, clause, vp)

    def _entity(self, e: str, kind: str, avoid: str | None = None, shun: str | None = None) -> Desc | None:
        """A description that singles out entity e (checked by execution), without attribute
        key ``avoid`` and without relating to entity ``shun``."""
        if kind == "name":
            return Desc([("Find", [self.name[e]])], name=self.name[e]) if e in self.findable else None
        if not self.direct.get(e):
            return None
        c = self.rng.choice(self.direct[e])
        if kind == "and":
            conds = [self._attr_cond(e, None, avoid=avoid), self._rel_cond(e, shun=shun)]
        elif kind in ("rel", "relq"):
            conds = [self._rel_cond(e, qual=kind == "relq", shun=shun)]
        else:
            conds = [self._attr_cond(e, {"str": "string", "num": "quantity"}.get(kind, kind), avoid=avoid)]
        desc = self._combine(c, conds, "And")
        if desc is None or self._run(desc.steps + [("QueryName", [])], single=False) != [self.name[e]]:
            return None
        return desc

    def _set(self, c: str, kind: str, seeds: list[str]) -> Desc | None:
        """A description of a subset of concept c, built around a random seed member."""
        if not seeds:
            return None
        if kind == "concept":
            return Desc([("FindAll", []), ("FilterConcept", [c])], c)
        ops = ("<", ">", "<", ">", "=", "!=")
        e, e2 = self.rng.choice(seeds), self.rng.choice(seeds)
        join = "Or" if kind == "or" else "And"
        if kind == "or":
            conds = [self._attr_cond(e, None, ops), self._attr_cond(e2, None, ops)]
        elif kind == "and":
            conds = [self._attr_cond(e, None, ops), self._rel_cond(e)]
        elif kind in ("rel", "relq"):
            conds = [self._rel_cond(e, qual=kind == "relq")]
        elif kind == "relattr":
            rel, attr = self._rel_cond(e), self._attr_cond(e, None, ops)
            if rel is None or attr is None:
                return None
            # One branch: the attribute filter narrows the related entities directly.
            conds = [Cond(rel.steps + attr.steps[1:], f"{rel.clause} and {attr.clause}", f"{rel.vp} and {attr.vp}")]
        else:
            conds = [self._attr_cond(e, {"str": "string", "num": "quantity"}.get(kind, kind), ops)]
        return self._combine(c, conds, join)

    @staticmethod
    def _combine(c: str, conds: list, join: str) -> Desc | None:
        # Two conditions on one key ("population < 5 or population < 9") read as padding.
        if any(x is None for x in conds) or (len(conds) == 2 and conds[0].key == conds[1].key and conds[0].key):
            return None
        steps = []
        for x in conds:
            steps += x.steps + [("FilterConcept", [c])]
        if len(conds) == 2:
            steps.append((join, []))
        word = f" {join.lower()} "
        return Desc(steps, c, clause=word.join(x.clause for x in conds), vp=word.join(x.vp for x in conds))

    # ----------------------------------------------------------------- execution
    def _run(self, steps: list[Step], single: bool = True):
        """Execute; return the sorted distinct answers, or with ``single`` the one answer."""
        try:
            out = self.execute(_program(steps))
        except Exception:  # noqa: BLE001 - the engine raises many kinds; a failing program is dropped
            return None
        out = sorted({str(x) for x in out}) if isinstance(out, (list, tuple, set)) else [str(out)]
        if not single:
            return out
        if len(out) != 1 or out[0] in ("", "not sure", "None"):
            return None
        return out[0]

    def _emit(self, cat: str, steps: list[Step], slots: dict, pools: list, atype: str,
              expect: str | None = None) -> dict | None:
        """Execute, phrase, add choices; None if the answer is not single (or not ``expect``)
        or the item repeats."""
        key = repr([("QueryName" if f == "What" else f, i) for f, i in steps])
        if key in self.seen_programs:
            return None
        answer = self._run(steps)
        if answer is None or (cat == "Count" and answer == "0") or expect not in (None, answer):
            return None
        program = _program(steps)
        shape = _sketch(program)
        # Least-used phrasing for this shape (ties broken by the RNG), so every shape
        # gets every phrasing once it has been drawn often enough.
        use = self.tpl_use[shape]
        low = min(use[i] for i in range(len(TEMPLATES[cat])))
        tid = self.rng.choice([i for i in range(len(TEMPLATES[cat])) if use[i] == low])
        question = TEMPLATES[cat][tid].format(**slots)
        question = question[0].upper() + question[1:]
        if question.lower() in self.seen_questions:
            return None
        choices = self._choices(answer, pools, atype)
        if choices is None:
            return None
        self.seen_programs.add(key)
        self.answers[cat][answer] += 1
        self.seen_questions.add(question.lower())
        use[tid] += 1
        if atype == "time":
            atype = "date" if "-" in answer.lstrip("-") else "year"
        item = {"question": question, "program": program, "choices": choices, "answer": answer}
        return {"item": item, "category": cat, "shape": shape, "tid": f"{cat}.{tid}", "atype": atype}

    def _choices(self, answer: str, pools: list, atype: str) -> list[str] | None:
        """The answer plus 9 distinct same-kind distractors, shuffled."""
        out, seen = [answer], {answer}
        is_date = atype == "time" and "-" in answer.lstrip("-")
        for pool in pools + [self._synth(answer, atype)]:
            # A year answer gets year distractors, a date answer dates ("1998" vs "1998-07-16").
            cands = [x for x in pool if x not in seen and (atype != "time" or ("-" in x.lstrip("-")) == is_date)]
            for x in self.rng.sample(cands, min(len(cands), 10 - len(out))):
                out.append(x)
                seen.add(x)
        if len(out) < 10:
            return None
        self.rng.shuffle(out)
        return out

    def _synth(self, answer: str, atype: str) -> list[str]:
        """Made-up values of the answer's kind, for when the KB holds too few real ones."""
        m = re.fullmatch(r"(-?\d+(?:\.\d+)?)( .+)?", answer)
        if atype in ("count", "quantity", "boolean") and m:
            n, unit = float(m.group(1)), m.group(2) or ""
            if atype == "count":
                return [str(x) for x in range(max(1, int(n) - 6), int(n) + 14)]
            nums = sorted({n * f for f in (0.25, 0.5, 0.6, 0.75, 0.8, 0.9, 1.1, 1.25, 1.5, 2, 3, 4)} - {n})
            return [(str(int(x)) if m.group(1).lstrip("-").isdigit() else f"{x:.2f}") + unit for x in nums]
        if atype == "time" and re.fullmatch(r"-?\d+", answer):
            return [str(int(answer) + d) for d in range(-15, 16) if d]
        if atype == "time" and re.fullmatch(r"\d{4}-\d\d-\d\d", answer):
            day = dt.date.fromisoformat(answer)
            return [(day + dt.timedelta(days=d)).isoformat() for d in range(-400, 401, 37) if d]
        return []

    def _entity_pools(self, c: str | None, names: list[str]) -> list[list[str]]:
        """Distractor names: the given ones, members of c, of its broader concepts, any entity."""
        return [names] + [[self.name[e] for e in self.members.get(x, [])] for x in [c] + self.broader.get(c, [])] + \
            [sorted(self.name[e] for e in self.findable)]

    # ----------------------------------------------------------------- categories
    def Count(self):
        c = self.rng.choice(self.set_concepts)
        d = self._set(c, self.rng.choice(SET_KINDS), self.members[c])
        if d is None:
            return None
        slots = {"cs": _plural(c), "vp": _agree(d.vp, True), "pl": d.pl()}
        return self._emit("Count", d.steps + [("Count", [])], slots, [], "count")

    def QueryName(self):
        d = self._entity(self.rng.choice(self.described), self.rng.choice(ENTITY_KINDS[3:]))  # no bare Find
        if d is None:
            return None
        fn = "What" if self.rng.random() < 0.3 else "QueryName"  # KQA Pro uses both
        slots = {"sg": d.sg(), "c": d.concept, "vp": _agree(d.vp, False)}
        return self._emit("QueryName", d.steps + [(fn, [])], slots, self._entity_pools(d.concept, []), "entity")

    def _attr_target(self, with_quals: bool = False) -> tuple[tuple, Desc | None]:
        """A random (key, value, qualifiers) attribute and a description of its entity."""
        e = self.rng.choice(self.described)
        attrs = [a for a in self.attrs.get(e, []) if not with_quals or self._quals(a[2])]
        if not attrs:
            return (), None
        attr = self.rng.choice(attrs)
        # The description avoids the asked key: "the population of the city whose population is 5".
        return attr, self._entity(e, self.rng.choice(ENTITY_KINDS), avoid=attr[0])

    def QueryAttr(self):
        attr, d = self._attr_target()
        if not d:
            return None
        k = attr[0]
        return self._emit("QueryAttr", d.steps + [("QueryAttr", [k])], {"k": k, "sg": d.sg()},
                          [self.values[k]], self.key_kind[k])

    def QueryAttrQualifier(self):
        attr, d = self._attr_target(with_quals=True)
        if not d:
            return None
        k, v = attr[0], _fmt(attr[1])
        qk = self.rng.choice(self._quals(attr[2]))[0]
        steps = d.steps + [("QueryAttrQualifier", [k, v, qk])]
        return self._emit("QueryAttrQualifier", steps, {"k": k, "v": v, "qk": qk, "sg": d.sg()},
                          [self.values[qk]], self.key_kind[qk])

    def _pair(self, fact) -> tuple[Desc, Desc] | None:
        s, _, o, _ = fact
        # Neither side is described through the other: "Marie Curie and the spouse of Marie Curie".
        ds = self._entity(s, self.rng.choice(ENTITY_KINDS), shun=o)
        do = ds and self._entity(o, self.rng.choice(ENTITY_KINDS), shun=s)
        return (ds, do) if do else None

    def QueryRelation(self):
        pair = self._pair(self.rng.choice(self.facts))
        if pair is None:
            return None
        steps = pair[0].steps + pair[1].steps + [("QueryRelation", [])]
        return self._emit("QueryRelation", steps, {"a": pair[0].sg(), "b": pair[1].sg()},
                          [self.relations], "relation")

    def QueryRelationQualifier(self):
        fact = self.rng.choice(self.qual_facts)
        pair = self._pair(fact)
        if pair is None:
            return None
        a, b, r = pair[0].sg(), pair[1].sg(), fact[1]
        qk = self.rng.choice(self._quals(fact[3]))[0]
        stmt = f"{a} {_agree(_rel_text(r, b, 'backward')[1], False)}"
        steps = pair[0].steps + pair[1].steps + [("QueryRelationQualifier", [r, qk])]
        return self._emit("QueryRelationQualifier", steps, {"a": a, "b": b, "r": r, "qk": qk, "stmt": stmt},
                          [self.values[qk]], self.key_kind[qk])

    def SelectAmong(self):
        k = self.rng.choice(sorted(self.qty_keys))
        holders = set(self.qty_keys[k])
        concepts = [c for c in self.set_concepts if len(holders.intersection(self.members[c])) >= 2]
        if not concepts:
            return None
        c = self.rng.choice(concepts)
        d = self._set(c, self.rng.choice(SET_KINDS), sorted(holders.intersection(self.members[c])))
        # At least two values to compare, else "the largest" is trivial.
        if d is None or len(self._run(d.steps + [("QueryAttr", [k])], single=False) or []) < 2:
            return None
        op = self.rng.choice(sorted(MOST))
        slots = {"c": c, "pl": d.pl(), "k": k, "most": self.rng.choice(MOST[op])}
        return self._emit("SelectAmong", d.steps + [("SelectAmong", [k, op])], slots,
                          self._entity_pools(c, []), "entity")

    def SelectBetween(self):
        k = self.rng.choice(sorted(self.qty_keys))
        e1 = self.rng.choice(self.qty_keys[k])
        # Compare like with like: both entities share a direct concept (two cities, not a city and a country).
        peers = [e for e in self.qty_keys[k] if e != e1 and set(self.direct[e]) & set(self.direct[e1])]
        if not peers:
            return None
        e2 = self.rng.choice(peers)
        v1 = [v for kk, v, _ in self.attrs[e1] if kk == k]
        v2 = [v for kk, v, _ in self.attrs[e2] if kk == k]
        # Skip ties, multi-valued keys and unit mismatches: the engine would pick arbitrarily.
        if len(v1) != 1 or len(v2) != 1 or v1[0].get("unit") != v2[0].get("unit") or \
                float(v1[0]["value"]) == float(v2[0]["value"]):
            return None
        d1 = self._entity(e1, self.rng.choice(ENTITY_KINDS), avoid=k, shun=e2)
        d2 = d1 and self._entity(e2, self.rng.choice(ENTITY_KINDS), avoid=k, shun=e1)
        if not d2:
            return None
        op = self.rng.choice(sorted(MORE))
        more = self.rng.choice(MORE[op])
        slots = {"a": d1.sg(), "b": d2.sg(), "k": k, "more": more, "a_more": _a(more)}
        c = min(set(self.direct[e1]) & set(self.direct[e2]))
        return self._emit("SelectBetween", d1.steps + d2.steps + [("SelectBetween", [k, op])], slots,
                          self._entity_pools(c, [self.name[e1], self.name[e2]]), "entity")

    def Verify(self):
        attr, d = self._attr_target()
        if not d:
            return None
        k, v, quals = attr
        vk, target = self._literal(v)
        pool = [_year(x) if vk == "year" else x for x in self.values[k]]
        # Often the true value (a likely "yes"), else another value of the key.
        if self.rng.random() < 0.4:
            target = self.rng.choice(sorted(set(pool)))
        op = "=" if vk == "string" else self.rng.choice(("=", "=", "<", ">", "!="))
        query, when = ("QueryAttr", [k]), ""
        qs = self._quals(quals)
        if qs and self.rng.random() < 0.6:
            qk, qv = self.rng.choice(qs)
            query = ("QueryAttrUnderCondition", [k, qk, _fmt(qv)])
            when = f" in {_fmt(qv)}" if qk == "point in time" else f" when the {qk} is {_fmt(qv)}"
        verify = (VERIFY[vk], [target] if vk == "string" else [target, op])
        cmp, cmpvp = CMP[vk][op]
        slots = {"k": k, "sg": d.sg(), "cmp": cmp, "cmpvp": cmpvp, "v": target, "when": when, "a_k": _a(k)}
        others = sorted(set(pool) - {target})
        # Ask for the rarer answer so far, which keeps yes and no balanced.
        seen = self.answers["Verify"]
        want = "yes" if seen["yes"] <= seen["no"] else "no"
        return self._emit("Verify", d.steps + [query, verify], slots, [["yes", "no"], others], "boolean", want)


def _train_quotas(n_train: int) -> dict[str, int]:
    """Train size per category: the KQA Pro mix with a floor (100 at n_train >= 900)."""
    floor = min(100, n_train // len(CATEGORIES))
    total = sum(KQAPRO_MIX.values())
    quotas = {c: max(floor, round(n_train * KQAPRO_MIX[c] / total)) for c in CATEGORIES}
    while (diff := n_train - sum(quotas.values())) != 0:  # settle rounding and floors, largest first
        c = max(CATEGORIES, key=lambda c: (quotas[c] if diff < 0 else KQAPRO_MIX[c], KQAPRO_MIX[c]))
        quotas[c] += 1 if diff > 0 else -1
    return quotas


def _round_robin(records: list[dict]) -> list[dict]:
    """Interleave shapes (in generation order within each) so rare shapes survive the cut."""
    by_shape = defaultdict(list)
    for r in records:
        by_shape[r["shape"]].append(r)
    out, lists = [], [by_shape[s] for s in sorted(by_shape)]
    for i in range(max((len(x) for x in lists), default=0)):
        out += [x[i] for x in lists if i < len(x)]
    return out


def generate(kb: dict, execute: Execute, seed: int = 0, n_train: int = 2000,
             val_per_category: int = 50, test_per_category: int = 50) -> tuple[dict[str, list[dict]], dict]:
    """Generate the mini-kqapro questions over a KB.

    Args:
        kb: KB dict in the newer official ``kb.json`` schema (concepts with ``subclassOf``,
            relations with ``relation``). It is only read.
        execute: Runs a program (list of ``{function, dependencies, inputs}``) and returns
            the engine's raw output (``str`` or ``list[str]``), raising on failure.
        seed: Seed of the single RNG; the output is a pure function of (kb, seed, sizes).
        n_train: Train size, spread over categories like KQA Pro's validation set.
        val_per_category: Validation questions per category.
        test_per_category: Test questions per category.

    Returns:
        ``({"train", "val", "test"}, stats)``. Train and val items carry
        ``question, program, choices, answer``; test items only ``question, choices``.

    Raises:
        ValueError: If the KB cannot supply enough questions for val and test.
    """
    rng = random.Random(seed)
    gen = _Generator(kb, execute, rng)
    quotas = _train_quotas(n_train)
    fixed = val_per_category + test_per_category
    pools = {}
    for cat in CATEGORIES:
        target = fixed + quotas[cat] + quotas[cat] // 4 + 10  # slack covers other categories' shortfalls
        records, shape_n, attempts = [], Counter(), 0
        # A shape drawn fewer than 3 times cannot show 3 phrasings, so it is dropped and
        # only the other shapes count towards the target.
        while sum(n for n in shape_n.values() if n >= 3) < target and attempts < 60 * target:
            attempts += 1
            rec = getattr(gen, cat)()
            if rec:
                records.append(rec)
                shape_n[rec["shape"]] += 1
        pools[cat] = _round_robin([r for r in records if shape_n[r["shape"]] >= 3])
        if len(pools[cat]) < fixed:
            raise ValueError(f"the KB yields only {len(pools[cat])} {cat} questions, {fixed} needed")
    take = {c: min(len(pools[c]), fixed + quotas[c]) for c in CATEGORIES}
    short = n_train + fixed * len(CATEGORIES) - sum(take.values())
    for c in sorted(CATEGORIES, key=lambda c: (take[c] - len(pools[c]), c)):  # most left over first
        extra = min(short, len(pools[c]) - take[c])
        take[c] += extra
        short -= extra
    if short:
        raise ValueError(f"the KB yields {short} questions too few for a train split of {n_train}")
    splits = {"train": [], "val": [], "test": []}
    for c in CATEGORIES:
        kept = pools[c][:take[c]]
        rng.shuffle(kept)
        splits["val"] += kept[:val_per_category]
        splits["test"] += kept[val_per_category:fixed]
        splits["train"] += kept[fixed:]
    for name in sorted(splits):
        rng.shuffle(splits[name])
    stats = _stats(splits)
    out = {name: [r["item"] for r in recs] for name, recs in splits.items()}
    out["test"] = [{"question": x["question"], "choices": x["choices"]} for x in out["test"]]
    return out, stats


def _stats(splits: dict[str, list[dict]]) -> dict:
    """Sizes, categories, sketches, phrasings per shape and answer types of the splits."""
    every = [r for name in sorted(splits) for r in splits[name]]
    phrasings = defaultdict(set)
    for r in every:
        phrasings[r["shape"]].add(r["tid"])
    return {
        "sizes": {n: len(s) for n, s in sorted(splits.items())},
        "per_category": {n: dict(sorted(Counter(r["category"] for r in s).items())) for n, s in sorted(splits.items())},
        "sketches": {"all": len(phrasings), "train+val": len({r["shape"] for r in splits["train"] + splits["val"]}),
                     **{n: len({r["shape"] for r in s}) for n, s in sorted(splits.items())}},
        "phrasings_per_shape": {s: len(t) for s, t in sorted(phrasings.items())},
        "min_phrasings_per_shape": min((len(t) for t in phrasings.values()), default=0),
        "answer_types": {n: dict(sorted(Counter(r["atype"] for r in s).items())) for n, s in sorted(splits.items())},
        "shapes": dict(sorted(Counter(r["shape"] for r in every).items())),
    }

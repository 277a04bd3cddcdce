"""The CBR² prompt (the paper's Section 4.3): the one place its wording and layout live.

A prompt has four parts, in this order:

1. role instructions: KoPL syntax (of the configured program format), typing rules and
   execution semantics;
2. the definitions of all KoPL functions, generated from the function table
   (``cbr2.kopl.functions``), so a new function shows up here without an edit;
3. the retrieved cases, each with its own retrieved ontology and fact triples and its
   program in the configured text form;
4. the target question with its retrieved knowledge and the ``Program:`` slot.

With linking (``retrieval.link``), each question (a case's and the target's) is followed by what
it names itself: its KB entities, concepts and literal values (``cbr2.retrieval.linking``), so
the model can tell the question's own items from the retrieved context, and a case shows how
its question's items became its program's arguments.

Parts 1-2 are identical for every question of a run (``Prompt.system``), which lets the
backends reuse their computation across prompts; parts 3-4 are ``Prompt.user``.

The builder's input for the target question is a ``Query`` (id and text) and what retrieval
returned for it: it cannot see the target's gold program or answer. Cases are training
questions, shown with their gold programs (that is what a case is for).

Any change to the wording or layout must bump ``PROMPT_VERSION``: the version is recorded
with every result, and the predictions cache is keyed by the prompt's hash. The correction
prompt of the adaptive fallback (``correction_prompt``, ``generation.fallback``) is versioned
apart, by ``FALLBACK_VERSION``. A new style behind a switch (``prompt.knowledge_style``) whose
default leaves the text as it was needs no bump: the run's config records the switch, and the
hash keys the text either way.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

from cbr2.common.records import Prompt
from cbr2.kb.triples import Triple
from cbr2.kopl.functions import CLOSED_KINDS, FUNCTIONS, FunctionSpec
from cbr2.kopl.text import FORMATS, to_text

if TYPE_CHECKING:  # annotations only: the retrieval modules load faiss, the prompt needs none of it
    from cbr2.retrieval.cases import Case, Query
    from cbr2.retrieval.knowledge import Knowledge
    from cbr2.retrieval.linking import Links

PROMPT_VERSION = "cbr2-prompt-2"
"""Bump on any change to what a prompt says or how it is laid out."""

PROGRAM_SLOT = "Program:"

KNOWLEDGE_STYLES = ("triples", "steps")
"""How fact triples are shown (``prompt.knowledge_style``): their text, or ``fact_steps``."""

_ROLE = (
    "You translate questions about a knowledge base (KB) into KoPL programs. KoPL programs are built from "
    "the functions defined below and are executed on the KB to produce the answer. Write exactly one program "
    "for the last question, in the same form as the examples, and stop after its last line."
)

_SYNTAX = {
    "dag": (
        "Program form (a DAG of steps, one branch per line):\n"
        "- Lines are labelled r1, r2, ... in order. A line starts with Find[...] or FindAll[], with a reference "
        "rK to an earlier line, or with a pair (rI, rJ) for a function that takes two inputs; its steps follow, "
        "joined by \" → \". Each step takes the result of the step before it.\n"
        "- Start a new line for an independent branch; join branches with a pair: (r1, r2) → And[].\n"
        "- Arguments go in square brackets, separated by \" | \". A function without arguments has empty "
        "brackets.\n"
        "- The last step of the last line gives the answer."
    ),
    "chain": (
        "Program form (a flat chain, one step per line, in execution order):\n"
        "- Each step takes the result of the step before it. A function with two inputs takes the results of "
        "the two most recent unfinished branches: write the first branch, then the second (starting again with "
        "Find[...] or FindAll[]), then the joining function.\n"
        "- Arguments go in square brackets, separated by \" | \". A function without arguments has empty "
        "brackets.\n"
        "- The last step gives the answer."
    ),
}

_TYPES = (
    "Types and execution:\n"
    "- entities: a set of KB entities. facts: entities together with the facts that selected them; a facts "
    "value can be used wherever entities are expected, and qualifier filters (QFilter*) need facts.\n"
    "- values: attribute values (from QueryAttr*); Verify* compares them and answers yes, no or not sure.\n"
    "- Final answers: names, name, count, bool, relations, qualifiers or values.\n"
    "- Arguments must be written exactly as the KB writes them: entity names, concepts, attribute keys, "
    "relations and qualifier keys as they appear in the knowledge triples. Quantities are a number and an "
    "optional unit (\"3715 metre\"), years are four digits, dates are yyyy-mm-dd.\n"
    "- Relate[relation | forward] goes from subject to object; backward goes from object to subject."
)

_KINDS = {
    "entity": "entity name", "concept": "concept", "key": "attribute key", "qkey": "qualifier key",
    "relation": "relation", "string": "text", "quantity": "quantity", "year": "year", "date": "date",
    "any": "value",
}


def function_definition(spec: FunctionSpec) -> str:
    """One function's line: call form, argument kinds, input and output types, meaning."""
    args = " | ".join(a.name for a in spec.args)
    inputs = ", ".join(spec.inputs) if spec.inputs else "nothing"
    kinds = []
    for a in spec.args:
        closed = CLOSED_KINDS.get(a.kind)
        kinds.append(f"{a.name}: one of {', '.join(closed)}" if closed else f"{a.name}: {_KINDS[a.kind]}")
    where = f" ({'; '.join(kinds)})" if kinds else ""
    return f"- {spec.name}[{args}]: {inputs} → {spec.output}. {spec.doc[0].upper()}{spec.doc[1:]}{where}."


def system_text(fmt: str) -> str:
    """Parts 1-2: role, syntax of the program form, typing rules, and every function's definition."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown prompt.format {fmt!r}; expected one of {', '.join(FORMATS)}")
    functions = "\n".join(function_definition(spec) for spec in FUNCTIONS.values())
    return f"{_ROLE}\n\n{_SYNTAX[fmt]}\n\n{_TYPES}\n\nFunctions (inputs → output):\n{functions}"


def fact_steps(fact: Triple, linked: Collection[str] = ()) -> str:
    """A fact triple as the KoPL steps that reach it, in the program's own syntax.

    A relation fact reads forward from its subject, or backward from its object when the object
    is one of ``linked`` and the subject is not: the chain then starts where the question's
    program starts. An attribute fact is its ``QueryAttr`` step and value, an ``instance of``
    fact its ``FilterConcept`` step. What a step reaches follows ``=``, not another ``→``: with an
    arrow, a small model read the value as one more step and went on past its answer
    (``QueryAttr[area] → VerifyNum[1636193 | <]``). Qualifiers follow in brackets, as in ``Triple.text``.
    A triple of no known kind (its ``terms`` name none) is shown as its text.

    Args:
        fact: A fact triple (``cbr2.kb.triples.fact_triples``).
        linked: The entity names the question names (``Links.entities``).
    """
    s, p, o = fact.subject, fact.predicate, fact.object
    if ("relation", p) in fact.terms:
        if o in linked and s not in linked:
            steps = f"Find[{o}] → Relate[{p} | backward] = {s}"
        else:
            steps = f"Find[{s}] → Relate[{p} | forward] = {o}"
    elif ("key", p) in fact.terms:
        steps = f"Find[{s}] → QueryAttr[{p}] = {o}"
    elif ("concept", o) in fact.terms:
        steps = f"Find[{s}] → FilterConcept[{o}]"
    else:
        return fact.text
    return steps + fact.qualifier_text


def _check_style(style: str) -> None:
    if style not in KNOWLEDGE_STYLES:
        raise ValueError(f"unknown prompt.knowledge_style {style!r}; expected one of {', '.join(KNOWLEDGE_STYLES)}")


def knowledge_text(knowledge: Knowledge, limit: int | None = None, style: str = "triples",
                   links: Links | None = None) -> str:
    """Ontology and fact triples as two bulleted sections; an empty kind is left out.

    Args:
        knowledge: Retrieved triples, best first.
        limit: Show at most this many triples of each kind (None: all).
        style: How facts are shown: ``triples`` (their text) or ``steps`` (``fact_steps``).
        links: What the question names; ``steps`` orients relation facts from its entities
            (None: every relation fact forward).

    Raises:
        ValueError: If ``style`` is not one of ``KNOWLEDGE_STYLES``.
    """
    _check_style(style)
    linked = frozenset(links.entities) if links is not None else frozenset()
    fact_line = (lambda t: t.text) if style == "triples" else (lambda t: fact_steps(t, linked))
    lines = []
    for title, triples, show in (("Ontology", knowledge.ontology, lambda t: t.text),
                                 ("Facts", knowledge.facts, fact_line)):
        shown: Sequence[Triple] = triples if limit is None else triples[:limit]
        if shown:
            lines.append(f"{title}:")
            lines += [f"- {show(t)}" for t in shown]
    return "\n".join(lines)


def links_text(links: Links | None) -> str:
    """The question's own entities, concepts and values, one line each; empty ones left out."""
    if links is None:
        return ""
    lines = []
    for title, items in (("Entities in the question", links.entities), ("Concepts in the question", links.concepts),
                         ("Values in the question", links.all_values())):
        if items:
            lines.append(f"{title}: " + "; ".join(items))
    return "\n".join(lines)


def _block(question: str, knowledge: Knowledge, limit: int | None, links: Links | None = None,
           style: str = "triples") -> str:
    parts = [f"Question: {question}", links_text(links), knowledge_text(knowledge, limit, style, links), PROGRAM_SLOT]
    return "\n".join(p for p in parts if p)


class PromptBuilder:
    """Builds the prompt of each question from what retrieval returned for it.

    Args:
        fmt: Program text form of the cases and of the expected answer: ``dag`` or ``chain``.
        case_triples: Triples of each kind shown with each case (None: all that were
            retrieved for it). The target question always shows all of its K_o + K_f.
        knowledge_style: How facts are shown: ``triples`` or ``steps`` (``fact_steps``); each
            block's facts are oriented by its own question's links.

    Raises:
        ValueError: If ``fmt`` or ``knowledge_style`` is not one of the known names.
    """

    def __init__(self, fmt: str, case_triples: int | None, knowledge_style: str = "triples"):
        _check_style(knowledge_style)  # at construction: a misspelt style fails before any retrieval
        self.fmt = fmt
        self.case_triples = case_triples
        self.knowledge_style = knowledge_style
        self.system = system_text(fmt)

    def build(self, query: Query, knowledge: Knowledge, cases: Sequence[Case],
              case_knowledge: Sequence[Knowledge], links: Links | None = None,
              case_links: Sequence[Links | None] | None = None,
              grounding: tuple[tuple[str, tuple[str, ...]], ...] = ()) -> Prompt:
        """The prompt of one question.

        Args:
            query: The target question (id and text only).
            knowledge: Its retrieved triples.
            cases: Its retrieved cases, most relevant first.
            case_knowledge: The triples retrieved for each case's question, aligned with ``cases``.
            links: What the target question names (None: linking off).
            case_links: What each case's question names, aligned with ``cases``.
            grounding: Grounded decoding's candidates (``Prompt.grounding``).
        """
        case_links = case_links if case_links is not None else [None] * len(cases)
        # The most relevant case goes last, next to the question: few-shot models copy the
        # nearest example most.
        style = self.knowledge_style
        examples = [f"{_block(c.question.question, k, self.case_triples, cl, style)}\n"
                    f"{to_text(c.question.program, self.fmt)}"
                    for c, k, cl in reversed(list(zip(cases, case_knowledge, case_links, strict=True)))]
        target = _block(query.text, knowledge, None, links, style)
        user = "\n\n".join([*examples, target]) + "\n"
        return Prompt(query.qid, self.system, user, grounding)


def prompt_hash(prompt: Prompt) -> str:
    """SHA-256 of what the prompt says (both parts) and of its grounded-decoding candidates,
    the predictions cache's first key."""
    text = f"{prompt.system}\x00{prompt.user}"
    if prompt.grounding:
        text += "\x00" + json.dumps(prompt.grounding, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


_FENCE_LANGUAGE = re.compile(r"[A-Za-z]*")


def program_text(completion: str) -> str:
    """The program in a completion: surrounding whitespace and one Markdown code fence removed.

    Chat models often wrap their answer in a fence; nothing else is changed here (the
    deterministic repair rules in ``cbr2.kopl.repair`` are the only other cleanup, and they
    are counted).
    """
    # String operations, not one regular expression: a lazy body followed by optional spaces
    # before the closing fence backtracks quadratically over long runs of spaces.
    text = completion.strip()
    if text.startswith("```") and text.endswith("```"):
        language, newline, rest = text[3:].partition("\n")
        if newline and len(rest) >= 3 and _FENCE_LANGUAGE.fullmatch(language.rstrip()):
            return rest[:-3].strip()
    return text


# ------------------------------------------------------------- fallback correction

FALLBACK_VERSION = "cbr2-fallback-2"
"""Bump on any change to what a correction prompt (``generation.fallback``) says or how it is laid
out, or to which of the two results a question keeps (2: a correction replaces the first pass
only when it fails less visibly)."""

EMPTY_ANSWER = ("it ran on the KB, but its answer is empty: an argument may name the wrong item, "
                "or a step may filter everything out")
"""The error message of a program that executed to an empty answer (the engine raises nothing)."""

Suggestion = tuple[str, str, str, Sequence[str]]
"""``(function, argument name, value as written, valid KB items nearest to it)``."""


def correction_prompt(prompt: Prompt, failed: str, error: str, suggestions: Sequence[Suggestion]) -> Prompt:
    """The one correction round's prompt: the original prompt, the failed attempt and what was wrong with it.

    The system part is the original one (a shareable prefix still). The user part is the
    original user part, which ends with the program slot, followed by the failed program, the
    error message, the valid KB items nearest to the arguments involved, and the slot again.
    Its inputs are the model's own output, the checker's or engine's message and KB
    vocabulary: nothing of the question's gold side.

    Args:
        prompt: The question's single-pass prompt.
        failed: The program text the model wrote (code fence removed).
        error: Why it failed (``EMPTY_ANSWER`` for an empty answer).
        suggestions: Nearest valid items per argument, most relevant argument first.
    """
    lines = [failed or "(nothing)", "", f"This program failed: {error}"]
    if suggestions:
        lines.append("Valid KB items closest to its arguments:")
        for function, arg, value, items in suggestions:
            lines.append(f"- {function} {arg} {json.dumps(value, ensure_ascii=False)}: "
                         + ", ".join(json.dumps(item, ensure_ascii=False) for item in items))
    lines += ["Write the corrected program for the same question, naming only items the KB has.", PROGRAM_SLOT]
    return Prompt(prompt.qid, prompt.system, prompt.user + "\n".join(lines) + "\n")

"""The KoPL function table: the one place that says what each function takes and returns.

Everything else (the parsers, the type checker, the prompt's function definitions, later the
decoding grammar) reads this table, so adding or changing a function happens here only.

Value types flowing between steps:

* ``entities``: a set of entities (``Find``, ``FindAll``, ``FilterConcept``, ``And``, ``Or``).
* ``facts``: a set of entities together with the facts that selected them (``Filter*``,
  ``QFilter*``, ``Relate``). It is a subtype of ``entities``; ``QFilter*`` needs it because
  qualifiers belong to facts, not to entities.
* ``values``: attribute values (``QueryAttr``, ``QueryAttrUnderCondition``), which ``Verify*``
  consumes and which is also a final answer.
* final answers: ``names``, ``name``, ``count``, ``bool``, ``relations``, ``qualifiers``.
"""

from __future__ import annotations

from dataclasses import dataclass

# Literal vocabularies of the closed argument kinds.
COMPARISON_OPS = ("=", "!=", "<", ">")
DIRECTIONS = ("forward", "backward")
BETWEEN_OPS = ("greater", "less")
AMONG_OPS = ("largest", "smallest")

CLOSED_KINDS: dict[str, tuple[str, ...]] = {
    "op": COMPARISON_OPS,
    "direction": DIRECTIONS,
    "between_op": BETWEEN_OPS,
    "among_op": AMONG_OPS,
}
"""Argument kinds whose legal values form a fixed list."""

ENTITY_TYPES = ("entities", "facts")
ANSWER_TYPES = ("names", "name", "count", "bool", "relations", "qualifiers", "values")
"""Output types a whole program may end with (``values`` is QueryAttr's answer)."""


@dataclass(frozen=True)
class Arg:
    """One textual argument of a function.

    Attributes:
        name: The argument's name as the prompt shows it (``key``, ``value`` ...).
        kind: What it must be: a KB item (``entity``, ``concept``, ``key``, ``qkey``,
            ``relation``), a literal of a value type (``string``, ``quantity``, ``year``,
            ``date``, ``any``: typed by the key, unknown without the KB), or a closed
            kind from ``CLOSED_KINDS``.
    """

    name: str
    kind: str


@dataclass(frozen=True)
class FunctionSpec:
    """Signature of one KoPL function.

    Attributes:
        name: Function name as it appears in programs.
        inputs: Types of the functional (step) inputs, in order; ``entities`` also
            accepts ``facts``.
        args: Textual arguments, in order.
        output: Type of the result.
        doc: One line for the prompt's function definitions.
    """

    name: str
    inputs: tuple[str, ...]
    args: tuple[Arg, ...]
    output: str
    doc: str

    @property
    def arity(self) -> int:
        """Number of functional inputs (0, 1 or 2)."""
        return len(self.inputs)


def _f(name: str, inputs: str, args: str, output: str, doc: str) -> FunctionSpec:
    """Compact constructor: ``inputs`` and ``args`` are space-separated, args as name:kind."""
    arg_list = tuple(Arg(*a.split(":")) for a in args.split())
    return FunctionSpec(name, tuple(inputs.split()), arg_list, output, doc)


_TABLE = [
    _f("FindAll", "", "", "entities", "all entities of the KB"),
    _f("Find", "", "name:entity", "entities", "the entities with the given name"),
    _f("FilterConcept", "entities", "concept:concept", "entities",
       "keep the entities that are instances of the concept (or of its subclasses)"),
    _f("FilterStr", "entities", "key:key value:string", "facts",
       "keep the entities whose string attribute `key` equals `value`"),
    _f("FilterNum", "entities", "key:key value:quantity op:op", "facts",
       "keep the entities whose quantity attribute `key` compares by `op` with `value`"),
    _f("FilterYear", "entities", "key:key value:year op:op", "facts",
       "keep the entities whose year attribute `key` compares by `op` with `value`"),
    _f("FilterDate", "entities", "key:key value:date op:op", "facts",
       "keep the entities whose date attribute `key` compares by `op` with `value`"),
    _f("QFilterStr", "facts", "qkey:qkey qvalue:string", "facts",
       "keep the facts whose string qualifier `qkey` equals `qvalue`"),
    _f("QFilterNum", "facts", "qkey:qkey qvalue:quantity op:op", "facts",
       "keep the facts whose quantity qualifier `qkey` compares by `op` with `qvalue`"),
    _f("QFilterYear", "facts", "qkey:qkey qvalue:year op:op", "facts",
       "keep the facts whose year qualifier `qkey` compares by `op` with `qvalue`"),
    _f("QFilterDate", "facts", "qkey:qkey qvalue:date op:op", "facts",
       "keep the facts whose date qualifier `qkey` compares by `op` with `qvalue`"),
    _f("Relate", "entities", "relation:relation direction:direction", "facts",
       "the entities linked to the input by `relation` (forward: input is the subject)"),
    _f("And", "entities entities", "", "entities", "intersection of two entity sets"),
    _f("Or", "entities entities", "", "entities", "union of two entity sets"),
    _f("QueryName", "entities", "", "names", "the names of the entities"),
    _f("Count", "entities", "", "count", "the number of entities"),
    _f("SelectBetween", "entities entities", "key:key op:between_op", "name",
       "of two entities, the one whose quantity `key` is greater / less"),
    _f("SelectAmong", "entities", "key:key op:among_op", "names",
       "the entities whose quantity `key` is largest / smallest"),
    _f("QueryAttr", "entities", "key:key", "values", "the values of attribute `key`"),
    _f("QueryAttrUnderCondition", "entities", "key:key qkey:qkey qvalue:any", "values",
       "the values of attribute `key` whose qualifier `qkey` equals `qvalue`"),
    _f("VerifyStr", "values", "value:string", "bool",
       "yes / no / not sure: do the queried string values equal `value`"),
    _f("VerifyNum", "values", "value:quantity op:op", "bool",
       "yes / no / not sure: do the queried quantities compare by `op` with `value`"),
    _f("VerifyYear", "values", "value:year op:op", "bool",
       "yes / no / not sure: do the queried years compare by `op` with `value`"),
    _f("VerifyDate", "values", "value:date op:op", "bool",
       "yes / no / not sure: do the queried dates compare by `op` with `value`"),
    _f("QueryRelation", "entities entities", "", "relations",
       "the relations from the first entity to the second"),
    _f("QueryAttrQualifier", "entities", "key:key value:any qkey:qkey", "qualifiers",
       "qualifier `qkey` of the fact (entity, `key`, `value`)"),
    _f("QueryRelationQualifier", "entities entities", "relation:relation qkey:qkey",
       "qualifiers", "qualifier `qkey` of the fact (first, `relation`, second)"),
]

FUNCTIONS: dict[str, FunctionSpec] = {spec.name: spec for spec in _TABLE}
"""The 27 KoPL functions by name."""

ALIASES: dict[str, str] = {"What": "QueryName"}
"""Names the datasets use for a function of the table (KQA Pro writes ``What``)."""

START_FUNCTIONS = frozenset(n for n, s in FUNCTIONS.items() if s.arity == 0)


def get_spec(name: str) -> FunctionSpec | None:
    """Return the spec of a function or alias, or None when the name is unknown."""
    return FUNCTIONS.get(ALIASES.get(name, name))


def canonical_name(name: str) -> str:
    """Resolve an alias (``What`` → ``QueryName``); other names are returned unchanged."""
    return ALIASES.get(name, name)


def accepts(input_type: str, produced: str) -> bool:
    """Whether a functional input declared as ``input_type`` accepts a ``produced`` value."""
    if input_type == "entities":
        return produced in ENTITY_TYPES
    return input_type == produced

"""A seeded generator of malformed and adversarial program texts for the fuzz tier.

Three families, all reproducible from one seed:

* ``mutations``: gold programs of the embedded benchmarks in both text forms, hit by one to
  three random edits (delete, insert, duplicate or swap spans and lines, characters that
  delimit the form, control and surrogate characters, huge numbers);
* ``adversarial``: fixed texts aimed at known weak spots (long runs that make naive regular
  expressions quadratic, megabyte inputs, deep nesting, huge labels, injection-like text);
* ``preserving``: edits that must not change the answer (code fences, a ``Program:`` label,
  trailing chatter, ASCII arrows, stray spaces, quoted arguments, a missing label).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator

from cbr2.kopl.text import ARROW

# Characters that mean something to the text forms or to the code that reads them.
_SPECIAL = list("[]|()\\:,→\n\t \"'`“”-=>#{}$%*") + ["->", "=>", "r", "r1", "r99", "\x00", "\x1b", "\ud800",
                                                    "\udfff", "\u202e", "\ufeff", "😀", "é", "\r"]
_HUGE = "9" * 5000


def _random_piece(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.6:
        return rng.choice(_SPECIAL)
    if roll < 0.8:
        return chr(rng.randrange(0x20, 0x7F))
    if roll < 0.9:
        return rng.choice(["Find[", "QueryName[]", "Relate[", " | forward]", "FilterNum[", "(r1, r2)", "Count[]"])
    if roll < 0.97:
        return str(rng.randrange(10 ** rng.randrange(1, 30)))
    return _HUGE


EDITS = ("delete span", "insert", "duplicate span", "shuffle lines", "duplicate line", "replace span",
         "replace delimiter")
"""The kinds of random edit ``mutate`` makes, in the order of its die."""


def mutate(text: str, rng: random.Random, kinds: Counter[str] | None = None) -> str:
    """One to three random edits of ``text``; ``kinds`` counts each edit made by its name in ``EDITS``."""
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(7)
        i = rng.randrange(len(text) + 1)
        j = min(len(text), i + rng.randrange(1, 12))
        if op in (0, 5) and not text:
            op = 6  # nothing to delete or replace: a delimiter is replaced instead (a no-op on "")
        if op == 0:
            text = text[:i] + text[j:]
        elif op == 1:
            text = text[:i] + _random_piece(rng) + text[i:]
        elif op == 2:
            text = text[:i] + text[i:j] * rng.randint(2, 4) + text[j:]
        elif op == 3:
            lines = text.splitlines()
            rng.shuffle(lines)
            text = "\n".join(lines)
        elif op == 4:
            lines = text.splitlines() or [""]
            k = rng.randrange(len(lines))
            lines.insert(k, lines[k])
            text = "\n".join(lines)
        elif op == 5:
            text = text[:i] + _random_piece(rng) + text[j:]
        else:
            text = text.replace(rng.choice([ARROW, "|", "[", "]", "r1", "r2", ":"]), _random_piece(rng), 1)
        if kinds is not None:
            kinds[EDITS[op]] += 1
    return text


def mutations(golds: list[str], n: int, seed: int, kinds: Counter[str] | None = None) -> Iterator[tuple[int, str]]:
    """``n`` mutated texts as (index of the gold text, text); ``kinds`` as in ``mutate``."""
    rng = random.Random(seed)
    for _ in range(n):
        k = rng.randrange(len(golds))
        yield k, mutate(golds[k], rng, kinds)


def adversarial() -> list[str]:
    """Texts aimed at the scoring path's weak spots; each must be judged in bounded time."""
    one = f"r1: Find[X] {ARROW} QueryName[]"
    many_lines = "\n".join(f"r{i}: Find[X{i}]" for i in range(1, 20_001))
    chain_many = "\n".join(["Find[X]"] + ["Relate[country | forward]"] * 20_000 + ["QueryName[]"])
    return [
        "",
        " " * 100_000,
        "-" * 100_000,
        "=" * 100_000,
        "|" * 100_000,
        "\\" * 100_000,
        "[" * 100_000,
        "]" * 100_000,
        "r1: Find[" + " " * 50_000 + "X]",
        "r1: Find[X]" + " " * 50_000 + "x",
        "r1: Find[X] " + "-" * 50_000 + " QueryName[]",
        "r1: Find[X] " + "=" * 50_000 + " QueryName[]",
        "r1: Find[X" + "|" * 50_000 + "] → QueryName[]",
        "r1: Find[X]" + " → QueryName[" * 20_000,
        "r1: Find[" + "[" * 20_000 + "X" + "]" * 20_000 + "] → QueryName[]",
        "(" * 50_000 + "r1" + ")" * 50_000,
        f"r{_HUGE}: Find[X] {ARROW} QueryName[]",
        f"r1: Find[X]\nr2: (r1, r{_HUGE}) {ARROW} And[] {ARROW} QueryName[]",
        f"r1: Find[X] {ARROW} FilterNum[height | {_HUGE} | >] {ARROW} QueryName[]",
        f"r1: Find[X] {ARROW} FilterNum[height | 1e{_HUGE} | >] {ARROW} QueryName[]",
        f"r1: Find[X] {ARROW} FilterYear[inception | {_HUGE} | <] {ARROW} QueryName[]",
        f"r1: FindAll[] {ARROW} FilterDate[date of birth | {_HUGE}-01-01 | <] {ARROW} Count[]",
        many_lines,
        many_lines + f"\nr20001: (r1, r2) {ARROW} And[] {ARROW} QueryName[]",
        chain_many,
        one * 20_000,
        (one + "\n") * 20_000,
        "x" * 1_000_000,
        one + "\n" + "chatter " * 150_000,
        "\ud800",
        "r1: Find[\ud800] → QueryName[]",
        "r1: Find[\udfff\ud800X] → QueryName[]",
        "\x00" * 1000 + one,
        one.replace(" ", "\x00"),
        "\u202e" + one,
        "r1: Find[__import__('os').system('touch /tmp/cbr2-pwned')] → QueryName[]",
        "__import__('os').system('touch /tmp/cbr2-pwned')",
        "r1: Find[{{7*7}}] → QueryName[]",
        "r1: Find[${jndi:ldap://x/a}] → QueryName[]",
        "r1: Find['); DROP TABLE answers; --] → QueryName[]",
        "r1: Find[X] → QueryName[]\n" * 3 + "```python\nimport os\nos.remove('x')\n```",
        "r1: (r1, r1) → Or[] → QueryName[]",
        "r1: Find[X]\nr2: (r1, r1) → Or[] → QueryName[]",
        "r1: Find[X]\nr1: Find[Y]\nr2: (r1, r1) → And[] → QueryName[]",
        "r2: r3 → QueryName[]\nr3: r2 → Count[]",
        "r1: r1 → QueryName[]",
    ]


def preserving(text: str, fmt: str, rng: random.Random) -> str:
    """An edit of a gold text that repair must undo, so the answer stays the same."""
    lines = text.splitlines()
    choice = rng.randrange(7)
    if choice == 0:
        return "```\n" + text + "\n```"
    if choice == 1:
        return "Program: " + text
    if choice == 2:
        return text + "\n\nQuestion: what else would you like to know?"
    if choice == 3:
        return text.replace(f" {ARROW} ", rng.choice([" -> ", "->", " => ", " ⟶ "]))
    if choice == 4:
        return text.replace(" | ", rng.choice(["|", " |  ", "  | "]))
    if choice == 5 and fmt == "dag" and len(lines) == 1:
        return lines[0].split(": ", 1)[1]  # the lone line loses its label
    return _quote_first_argument(text)


def _quote_first_argument(text: str) -> str:
    start = text.find("[")
    end = text.find("]", start)
    if start == -1 or end == start + 1 or "|" in text[start:end] or "\\" in text[start:end + 1]:
        return text + "\n"
    return text[: start + 1] + '"' + text[start + 1:end] + '"' + text[end:]

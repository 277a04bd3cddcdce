"""Answer one question and show why: ``python -m cbr2.service.ask "QUESTION" [options] [key=value ...]``.

    python -m cbr2.service.ask "Who is taller, Marie Curie or Pierre Curie?"
    python -m cbr2.service.ask "How many cities are there?" --json              # the trace as JSON
    python -m cbr2.service.ask "..." --show-prompt --ablation full llm.model=qwen2.5-coder-1.5b
    python -m cbr2.service.ask "Who teaches Databases?" --kb my_kb.json --cases my_cases.yaml

The configuration is composed as ``evaluate.py`` composes it (``--config``, ``--ablation``,
``key=value`` overrides); ``--kb FILE --cases FILE`` stand for ``data.name=custom data.kb=FILE
data.cases=FILE`` and come together (a few-shot method answers after solved cases over the KB).
The report lists what the question links to, the knowledge triples and cases retrieved (with
their scores and the views that found the cases), the prompt's size, the generated program and
the one that ran, each step's result, and the answer, or where and why the program failed.
``--json`` prints the trace instead (``cbr2.evaluation.trace``: the object the API returns with
each answer). Exit status: 0 answered, 1 the program failed (the report or trace is still
printed), 2 a user error (one line), 3 the LLM server failed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from cbr2.common.console import setup_logging
from cbr2.common.errors import UserError
from cbr2.config import ABLATIONS
from cbr2.config.cli import add_config_arguments
from cbr2.llm.openai_compat import LLMRequestError
from cbr2.service.api import KBQA, custom_overrides

INDENT = "    "


def _items(values: Sequence[Any] | None) -> str:
    return "; ".join(map(str, values)) if values else "—"


def _score(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, int | float) else "  —  "


def _block(text: str | None, empty: str) -> list[str]:
    """``text`` indented line by line, or ``empty`` when there is none."""
    if not text:
        return [f"{INDENT}({empty})"]
    return [INDENT + line for line in text.splitlines()]


def _step(step: dict[str, Any]) -> str:
    """One step: its number, its call, the steps whose results it reads, then what its result holds."""
    reads = f" ← {', '.join(map(str, step['inputs']))}" if step["inputs"] else ""
    call = f"{step['function']}[{' | '.join(step['args'])}]"
    first = ", ".join(step["first"])
    if step["holds"] in ("a count", "yes/no", "a name"):
        result = f"{step['holds']}: {first}"
    elif not step["count"]:
        result = f"{step['holds']} (0): empty"
    else:
        more = ", …" if step["count"] > len(step["first"]) else ""
        result = f"{step['holds']} ({step['count']:,}): {first}{more}"
    return f"{INDENT}{step['step']}. {call}{reads}  ⇒  {result}"


def report(trace: dict[str, Any]) -> str:
    """The human-readable report of a trace (what ``ask`` prints without ``--json``)."""
    out = [f"Question: {trace['question']}"]
    linked = trace["linked"]
    if linked is not None:
        values = "; ".join(f"{kind} {', '.join(vs)}" for kind, vs in linked["values"].items()) or "—"
        out.append(f"Linked: entities {_items(linked['entities'])} · concepts {_items(linked['concepts'])} · "
                   f"values {values}")
    knowledge = trace["knowledge"]
    if knowledge is None:
        out.append("Knowledge and cases: none retrieved (the configuration retrieves nothing)")
    else:
        if not knowledge["ontology"] and not knowledge["facts"]:
            out.append("Knowledge triples: none")
        for kind in ("ontology", "facts"):
            if knowledge[kind]:
                out.append(f"Knowledge, {'ontology' if kind == 'ontology' else 'fact'} triples (score, text):")
                out += [f"{INDENT}{_score(t['score'])}  {t['text']}" for t in knowledge[kind]]
        views = trace["case_views"]
        why = f" (views {', '.join(views['used']) or 'none'}: {views['why']})" if views else ""
        out.append(f"Cases{why}:" + ("" if trace["cases"] else " none"))
        for rank, case in enumerate(trace["cases"], 1):
            found = ", ".join(f"{f['view']} {_score(f['score']).strip()}" for f in case["found_by"])
            out.append(f"{INDENT}{rank}. {case['id']} [{found}] {case['question'] or ''}")
            out += [INDENT + line for line in _block(case["program"], "program not known")]
    prompt = trace["prompt"]
    tokens = f", {prompt['tokens']:,} tokens" if prompt["tokens"] is not None else ""
    chars = f"{prompt['chars']:,} characters" if prompt["chars"] is not None else "size not known"
    out.append(f"Prompt: {chars}{tokens}")
    if prompt["text"] is not None:
        out += _block(prompt["text"], "empty")
    generation, program = trace["generation"], trace["program"]
    if generation is not None:
        took = f" ({generation['seconds']:.1f} s)" if generation["seconds"] is not None else ""
        out.append(f"Generated{took}:")
        out += _block(generation["text"], "nothing")
        repairs = f"after repairs: {', '.join(program['repairs'])}" if program["repairs"] else "no repair needed"
        snapped = "; ".join(f"{c.get('value')} → {c.get('snapped')}" for c in program["canonicalized"])
        out.append(f"Program that ran ({repairs}{'; canonicalised ' + snapped if snapped else ''}):")
        out += _block(program["text"], "none: it did not parse and type-check")
    if trace["steps"]:
        out.append("Steps (each result: how many, the first ones):")
        out += [_step(s) for s in trace["steps"]]
    error = trace["error"]
    if trace["answered"]:
        answer = trace["answer"]
        out.append(f"Answer: {_items(answer) if isinstance(answer, list) else answer}")
        if trace["correct"] is not None:
            out.append(f"Correct: {'yes' if trace['correct'] else 'no'} (gold: {trace['gold']['answer']})")
    elif error is not None:
        where = f" at {error['where']}" if error["where"] else ""
        out.append(f"Failed ({error['kind']}){where}: {error['message']}")
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m cbr2.service.ask`` (and ``cbr2 ask``): the exit status (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m cbr2.service.ask", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("question", help="the question, in quotes")
    add_config_arguments(parser)
    parser.add_argument("--ablation", metavar="NAME", help=f"a Table 5 setting: {', '.join(ABLATIONS)}")
    parser.add_argument("--kb", metavar="FILE", help="your own KB (data.name=custom data.kb=FILE); with --cases")
    parser.add_argument("--cases", metavar="FILE", help="its solved cases (data.cases=FILE); with --kb")
    parser.add_argument("--json", action="store_true", help="print the trace as JSON instead of the report")
    parser.add_argument("--show-prompt", action="store_true", help="include the whole prompt, as the model read it")
    args = parser.parse_intermixed_args(argv)  # options may come between overrides
    setup_logging()  # logs go to stderr: stdout is the report or the JSON alone
    try:
        custom_overrides(args.kb, args.cases, names=("--kb", "--cases"))  # one without the other, in this CLI's words
        kbqa = KBQA.load(args.config, args.overrides, args.ablation, kb=args.kb, cases=args.cases)
        answer = kbqa.ask(args.question, show_prompt=args.show_prompt)
    except LLMRequestError as err:
        print(f"error: the LLM server failed: {err}", file=sys.stderr)
        return 3
    except UserError as err:  # the user's to fix: one line; anything else is a bug and shows its traceback
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        sys.stdout.write(json.dumps(answer.trace, ensure_ascii=False, indent=2) + "\n")
    else:
        sys.stdout.write(report(answer.trace))
    return 0 if answer.ok else 1


if __name__ == "__main__":
    sys.exit(main())

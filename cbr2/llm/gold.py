"""The gold "generator": writes each question's gold program as prompt-format text.

It exercises everything after generation (parse, check, repair, execute, score) without an
LLM; with a correct pipeline it scores Hits@1 = 1 and SER = 0 on any benchmark whose gold
answers come from the reference engine. It reads gold programs by design: it is a check of
the pipeline, never a method, and it is the only backend that is given them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from cbr2.common.errors import UserError
from cbr2.common.records import Completion, Prompt
from cbr2.kopl.program import Program
from cbr2.kopl.text import to_text
from cbr2.llm.base import FEATURES, Rendering


class GoldBackend(Rendering):
    """Writes gold programs in the configured text format.

    Args:
        fmt: ``dag`` or ``chain``.
        programs: The gold program of each question id.

    Raises:
        UserError: If a question has no gold program (e.g. the KQA Pro test split).
    """

    name = "gold"
    uses_chat = False
    """It reads no prompt: ``render`` shows the plain text."""
    capabilities = frozenset(FEATURES)
    """Every decoding setting is accepted and none changes what it writes: the gold program is the
    reference those settings aim at (it parses, type-checks and executes), and the writer is a check
    of the pipeline after generation, which must run with any generation section."""

    def __init__(self, fmt: str, programs: Mapping[str, Program | None]):
        missing = [qid for qid, program in programs.items() if program is None]
        if missing:
            raise UserError(f"llm.backend=gold needs gold programs, but {len(missing)} questions have none "
                             f"(first: {missing[0]}); evaluate a split with programs (e.g. data.split=val)")
        self.fmt = fmt
        self.programs = dict(programs)

    def identity(self) -> dict:
        """The predictions cache key beside the prompt."""
        return {"backend": self.name, "format": self.fmt}

    def generate(self, prompts: Sequence[Prompt],
                 on_result: Callable[[int, Completion], None] | None = None) -> list[Completion]:
        """One gold program text per prompt, looked up by the prompt's question id."""
        out = []
        for i, prompt in enumerate(prompts):
            out.append(Completion(to_text(self.programs[prompt.qid], self.fmt)))
            if on_result:
                on_result(i, out[-1])
        return out

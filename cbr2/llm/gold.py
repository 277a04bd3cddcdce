"""The gold "generator": writes each question's gold program as prompt-format text.

It exercises everything after generation (parse, check, repair, execute, score) without an
LLM; with a correct pipeline it scores Hits@1 = 1 and SER = 0 on any benchmark whose gold
answers come from the reference engine.
"""

from __future__ import annotations

from collections.abc import Sequence

from cbr2.data.questions import Question
from cbr2.kopl.text import to_text


class GoldBackend:
    """Writes gold programs in the configured text format.

    Args:
        fmt: ``dag`` or ``chain``.
    """

    name = "gold"

    def __init__(self, fmt: str = "dag"):
        self.fmt = fmt

    def generate(self, questions: Sequence[Question]) -> list[str]:
        """One program text per question.

        Raises:
            ValueError: If a question has no gold program (e.g. the KQA Pro test split).
        """
        missing = [q.qid for q in questions if q.program is None]
        if missing:
            raise ValueError(f"llm.backend=gold needs gold programs, but {len(missing)} questions have none "
                             f"(first: {missing[0]}); evaluate a split with programs (e.g. data.split=val)")
        return [to_text(q.program, self.fmt) for q in questions]

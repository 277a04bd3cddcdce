"""CBR² as a service: the Python API (``api.py``: ``KBQA``, load once, answer many, each answer
with its trace) and the ``ask`` command over it (``ask.py``: ``python -m cbr2.service.ask``).

The top layer of the package (``tests/test_layout.py``: ``LAYERS``): it uses the evaluation's
stages as they are, so a question asked here goes the way an evaluated one does.
"""

from cbr2.service.api import KBQA, MAX_QUESTION_CHARS, Answer, QuestionError

__all__ = ["KBQA", "MAX_QUESTION_CHARS", "Answer", "QuestionError"]

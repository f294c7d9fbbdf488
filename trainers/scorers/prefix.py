"""Partial credit for an answer that starts right: ``eval.scorer=trainers.scorers.prefix:prefix_credit``.

Exact match gives nothing to ``Hava`` for ``Havana``; this scorer gives the characters the answer gets right from its
start, over the longer of the two, so an answer that stops early or runs on past the reference scores less than the
reference itself, and any answer that does not start with the reference's first character scores 0.
"""


def prefix_credit(prompt: str, reference: str, answer: str) -> float:
    """The length of the common prefix of the stripped answer and reference, over the longer one's length: in [0, 1],
    1 only for the reference itself (0 when both are empty)."""
    answer, reference = answer.strip(), reference.strip()
    longest = max(len(answer), len(reference))
    if not longest:
        return 0.0
    shared = 0
    for a, r in zip(answer, reference, strict=False):
        if a != r:
            break
        shared += 1
    return shared / longest

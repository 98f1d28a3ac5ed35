"""How many examples a hypothesis test draws: its own count, scaled by the profile's (``tests/conftest.py``).

A test states the count it needs at CI's size (``settings(max_examples=examples(15))``); the ``ci`` and ``dev``
profiles keep hypothesis' default of 100 examples and so the count itself, ``wide`` has ten times as many.
"""

from __future__ import annotations

from hypothesis import settings

_BASE = 100  # hypothesis' default max_examples: the profiles' unit


def examples(n: int) -> int:
    return max(1, round(n * settings.default.max_examples / _BASE))

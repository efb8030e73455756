"""Statements and layouts for the agreement verdict's tests
(ranks/test_verdict.py, ranks/test_words.py): what ranks say, built the
way the ranks build them (each layout with the planner's digest)."""

from __future__ import annotations

import dataclasses

from goddp.ranks.group import Group
from goddp.ranks.layout import Layout
from goddp.ranks.verdict import Statement

BUILD = "goddp test abi 0"
CAPS = (4096, 8192, 1024)


def layout(caps, *buckets, order="ready", build=BUILD) -> Layout:
    return Layout(tuple(tuple(b) for b in buckets), tuple(caps), order, build)


# A and B differ in where parameters 5 and 3 go.
A = layout(CAPS, (5, 4), (3, 2), (1, 0))
B = layout(CAPS, (3, 4), (5, 2), (1, 0))
NAMES = {p: f"layers.{p}.weight" for p in range(6)}


def name_of(p: int) -> str:
    return NAMES.get(p, f"parameter {p}")


def proposes(the_layout: Layout = A, **kw) -> Statement:
    """A rank that proposes the_layout, with its real digest."""
    return Statement(the_layout, digest=the_layout.digest(), fingerprint=0xABC, pieces=3, **kw)


def keeps(reason: str | None, **kw) -> Statement:
    return Statement(None, reason=reason, fingerprint=0xABC, pieces=3, **kw)


def later(s: Statement) -> Statement:
    return dataclasses.replace(s, layout=None, digest=None, later=True)


def lost(s: Statement, why: str) -> Statement:
    return dataclasses.replace(s, layout=None, digest=None, lost=why)


def strict(s: Statement) -> Statement:
    return dataclasses.replace(s, strict=True)


def failed(reason: str = "fallback: planning failed") -> Statement:
    """A rank whose planning failed."""
    return dataclasses.replace(keeps(reason), fingerprint=None)


def group(name: str, size: int) -> Group:
    return Group(name=name, ranks=tuple(range(size)), rank=0, timeout_s=1.0)

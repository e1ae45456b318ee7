"""Polars' allocator setting for this process, chosen before polars is first imported.

polars' allocator (jemalloc) reads ``_RJEM_MALLOC_CONF`` once, when polars is
imported. polars' own setting keeps freed pages for 0.5 s, then as "muzzy" pages
(still resident) for 1 s more. Two kinds of work want different settings:

* ``replay`` (the default, chosen when ``pipeline`` is imported): a replay frees
  about 1 GB after reading 10M requests and at once allocates the simulator's
  state; a 10M replay peaked at 3.0 GB with polars' setting, 2.2 GB with freed
  pages returned after 0.1 s (bench/RESULTS.md, Replay memory);
* ``ingest`` (``tracereplay ingest`` chooses it): each block allocates and frees
  tens of MB, and returning those pages at once makes the next block fault them
  in again: 40% more page faults and about 5% of the time of a 1M-record ingest
  (bench/RESULTS.md, Ingest speed). It keeps polars' setting.

A decay the user set is left alone. Child processes inherit the variable: polars'
own setting, which polars writes into it, and the one set here (marked in
``MARK``) do not count as the user's.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

VARIABLE = "_RJEM_MALLOC_CONF"
MARK = "TRACEREPLAY_RJEM_MALLOC_CONF"  # the value set here, for child processes to know it
POLARS = "dirty_decay_ms:500,muzzy_decay_ms:1000"
RETURN_SOON = "dirty_decay_ms:100,muzzy_decay_ms:0"
WORK = ("replay", "ingest")


def inherited(env: Mapping[str, str]) -> str:
    """The variable as ``env`` holds it, without the setting a tracereplay process made
    (which ``MARK`` names; polars puts its own in front of it on import)."""
    value = env.get(VARIABLE, "")
    mark = env.get(MARK)
    if mark and value in (mark, f"{POLARS},{mark}"):
        value = value.removesuffix(RETURN_SOON).rstrip(",")
    return value


_GIVEN = inherited(os.environ)  # as this process found it


def configure(work: str) -> bool:
    """Choose the setting for ``work`` (``WORK``).

    Returns False when it changes nothing: polars is imported already, or the
    user set a decay (jemalloc reads its options left to right, the last one wins).
    """
    if work not in WORK:
        raise ValueError(f"unknown work {work!r}; choose one of {', '.join(WORK)}")
    if "polars" in sys.modules or "decay_ms" in _GIVEN.replace(POLARS, ""):
        return False
    if work == "replay":
        os.environ[VARIABLE] = os.environ[MARK] = (
            f"{_GIVEN},{RETURN_SOON}" if _GIVEN else RETURN_SOON
        )
        return True
    os.environ.pop(MARK, None)
    if _GIVEN:
        os.environ[VARIABLE] = _GIVEN
    else:
        os.environ.pop(VARIABLE, None)
    return True

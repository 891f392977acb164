"""The keep-alive's events (engine/keepalive/keeper.py publishes them on the engine's bus):
why each model was loaded, what became of each pre-warm, and each change of a model's plan.
Counters, metrics and log lines subscribe, as to the engine's other events (engine/events.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from snoozeml.engine.events import EngineEvent

# Why a model was loaded: a request found it cold, the keep-alive pre-warmed it, an explicit
# load (the repository API), `preload = true` or `replicas.min` at start, or ModelMesh placed it.
CAUSES = ("request", "prewarm", "explicit", "preload", "modelmesh")
PREWARM_OUTCOMES = ("used", "wasted", "skipped")


@dataclass(slots=True)
class ColdStart(EngineEvent):
    """The model's first replica loaded (it was UNLOADED or FAILED), because of `cause`."""

    model: str
    cause: str  # one of CAUSES
    seconds: float  # the load's, from memory admission


@dataclass(slots=True)
class Prewarm(EngineEvent):
    """A pre-warm started, or ended: `used` (a request came while it was loading or loaded),
    `wasted` (the model unloaded first: `detail` is the unload's reason, empty when its
    window ran out), `skipped` (it never loaded: `detail` says why)."""

    model: str
    outcome: str  # "started" or one of PREWARM_OUTCOMES
    detail: str = ""


@dataclass(slots=True)
class KeepAlivePlanned(EngineEvent):
    """An adaptive model's plan changed its reason (young history, learned, a fallback)."""

    model: str
    reason: str
    unload_after_s: float | None
    prewarm_after_s: float | None
    keep_until_s: float | None

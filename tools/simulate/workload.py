"""Seeded multi-turn workload: sessions whose turns share a growing prefix.

A session starts with one of a few system prompts (shared *lengths*, so sessions of one tenant
look alike) and then runs several turns. Turn ``t`` re-sends the whole conversation so far
(system prompt, every earlier prompt and answer) plus a new prompt, and decodes an answer. That
re-sent history is the prefix a cache can serve. Lengths are lognormal; arrivals of first turns
are a Poisson process in engine steps; a later turn arrives ``think_steps`` after the previous
one finished (the engine enforces that, since it depends on timing).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import NewType

from tools.simulate.config import SimConfig

__all__ = ["SessionId", "SessionSpec", "TurnSpec", "Workload", "generate_workload"]

SessionId = NewType("SessionId", int)


@dataclass(frozen=True, slots=True)
class TurnSpec:
    """One request of a session: ``prompt_len`` new prompt tokens, then ``output_len`` decodes."""

    prompt_len: int
    output_len: int


@dataclass(frozen=True, slots=True)
class SessionSpec:
    """A conversation: its first turn arrives at ``arrival_step``; turns run strictly in order."""

    session: SessionId
    arrival_step: int
    system_len: int
    turns: tuple[TurnSpec, ...]

    def history_len(self, turn_index: int) -> int:
        """Tokens of conversation before turn ``turn_index``'s new prompt."""
        return self.system_len + sum(t.prompt_len + t.output_len for t in self.turns[:turn_index])

    @property
    def total_len(self) -> int:
        return self.history_len(len(self.turns))


@dataclass(frozen=True, slots=True)
class Workload:
    sessions: tuple[SessionSpec, ...]

    @property
    def requests(self) -> int:
        return sum(len(s.turns) for s in self.sessions)

    @property
    def max_context_len(self) -> int:
        return max(s.total_len for s in self.sessions)


def _lognormal(rng: random.Random, mu: float, sigma: float, hi: int) -> int:
    return max(1, min(hi, round(rng.lognormvariate(mu, sigma))))


def generate_workload(cfg: SimConfig) -> Workload:
    """Sessions totalling exactly ``cfg.requests`` turns; a pure function of ``cfg``.

    Turn counts are geometric with mean ``cfg.mean_turns``; a session never outgrows the device
    pool (its total context is capped at half the device pool) so every turn can be served.
    """
    rng = random.Random(cfg.seed)
    system_lens = [_lognormal(rng, 5.5, 0.4, 2 * cfg.max_prompt) for _ in range(cfg.system_prompts)]
    cap = max(cfg.page_size * 2, cfg.device_tokens // 2)
    p_stop = 1.0 / cfg.mean_turns
    sessions: list[SessionSpec] = []
    remaining = cfg.requests
    step = 0.0
    while remaining > 0:
        system_len = min(rng.choice(system_lens), cap // 2)
        n_turns = 1
        while rng.random() > p_stop and n_turns < remaining:
            n_turns += 1
        n_turns = min(n_turns, remaining)
        turns: list[TurnSpec] = []
        total = system_len
        for _ in range(n_turns):
            prompt = _lognormal(rng, cfg.prompt_mu, cfg.prompt_sigma, cfg.max_prompt)
            output = _lognormal(rng, cfg.output_mu, cfg.output_sigma, cfg.max_output)
            if total + prompt + output > cap:
                break
            turns.append(TurnSpec(prompt, output))
            total += prompt + output
        if not turns:  # the system prompt alone nearly fills the cap: one short turn
            turns.append(TurnSpec(1, 1))
        sessions.append(SessionSpec(SessionId(len(sessions)), int(step), system_len, tuple(turns)))
        remaining -= len(turns)
        step += -math.log(1.0 - rng.random()) / cfg.arrival_per_step
    return Workload(tuple(sessions))

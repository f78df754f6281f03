"""Fixtures for the refactor-safety tool tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tools._synth import BASE_FILES, SynthRepo


@pytest.fixture
def synth(tmp_path: Path) -> tuple[SynthRepo, str]:
    """A repository with two packages (highpkg above lowpkg) and its base commit id."""
    repo = SynthRepo(tmp_path / "repo")
    repo.write(BASE_FILES)
    return repo, repo.commit("base")

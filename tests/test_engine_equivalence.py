"""A faster engine changes no output: every fixture log and two generated logs give exactly the requests, events
and line counts that the engine it replaced gave (digests in fixtures/engine-digests.json, tests/engine_digest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import engine_digest as D

EXPECTED = json.loads(D.DIGESTS.read_text(encoding="utf-8"))


@pytest.mark.parametrize("log", D.fixture_logs(), ids=lambda p: p.name)
def test_a_fixture_log_gives_what_it_gave(log: Path, tmp_path: Path) -> None:
    assert D.digest_log(log, tmp_path) == EXPECTED[log.relative_to(D.ROOT).as_posix()]


def test_generated_logs_give_what_they_gave(tmp_path: Path) -> None:
    for key, log in D.generated_logs(tmp_path).items():
        assert D.digest_log(log, tmp_path / key) == EXPECTED[key], key


def test_every_digest_has_its_log() -> None:
    keys = {p.relative_to(D.ROOT).as_posix() for p in D.fixture_logs()} | {f"generated-{f}" for f in D.GENERATED}
    assert set(EXPECTED) == keys

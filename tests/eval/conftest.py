from __future__ import annotations

import pytest

from eval.verifiers.verify import MathVerifier


@pytest.fixture(scope="session")
def math_verifier():
    """One pool of 2 verifier processes for the whole session (spawning one costs seconds)."""
    with MathVerifier(workers=2, timeout=5.0) as verifier:
        yield verifier

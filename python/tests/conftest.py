"""Shared setup: a fresh kernel cache for the session (set before flexjit
creates its first context, which reads the environment once), the repository
root, and the flexjit package under test (the installed one; FLEXJIT_LIBRARY
points a source checkout's python/ at a build tree's library)."""
import os
import tempfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(REPO, "examples")

_cache = tempfile.mkdtemp(prefix="flexjit-pytest-cache-")
os.environ.setdefault("FLEXJIT_CACHE_DIR", _cache)


@pytest.fixture(scope="session")
def repo():
    return REPO


def example(name):
    return os.path.join(EXAMPLES, name)

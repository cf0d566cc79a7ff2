import os

import pytest

from muarl.domain import Domain, get_domain


def under_ci() -> bool:
    """Whether the tests run as CI (``CI`` set, as CI services and ``.ci/run`` do; ``0``/``false`` is unset)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require(available: bool, reason: str) -> None:
    """Skip the calling test or module when what it needs (a package, a data set) is not here, except under
    CI, where that fails it: a test that cannot run must not let CI pass as if it had.

    For what CI is meant to provide (``bash scripts/install.sh --dev`` and the data it expects). A test
    that is legitimately not for this environment (vLLM present or absent, a GPU) skips with
    ``pytest.skip``."""
    __tracebackhide__ = True  # pytest reports the caller's line, not this one
    if available:
        return
    if under_ci():
        pytest.fail(f"{reason} (CI is set: a test that cannot run fails)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


@pytest.fixture(scope="session")
def retail() -> Domain:
    return get_domain("retail")

import pytest

from muarl.domain import Domain, get_domain


@pytest.fixture(scope="session")
def retail() -> Domain:
    return get_domain("retail")

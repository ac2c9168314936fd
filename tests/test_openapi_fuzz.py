"""schemathesis over the live service's own OpenAPI schema (fake backend): no 5xx, every status,
content type and body as documented, and schema-violating requests refused.

`positive_data_acceptance` is left out: the schema cannot say what the model decides (a `dimensions`
above the model's, duplicate document ids in one request), so such schema-valid requests get 422.
"""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck  # noqa: E402
from hypothesis import settings as hypothesis_settings  # noqa: E402
from schemathesis.checks import CHECKS  # noqa: E402

from service.api.registry import ModelRegistry  # noqa: E402
from service.engine.backends.fake import FakeBackend  # noqa: E402
from service.engine.core import Engine  # noqa: E402
from service.settings import Settings  # noqa: E402
from tests.conftest import LiveServer  # noqa: E402


@pytest.fixture(scope="module")
def fake_service():
    registry = ModelRegistry()
    registry.add_in_process("fake", Engine(FakeBackend(name="fake")))
    with LiveServer(Settings(backend="fake", max_search_k=50), registry) as server:
        yield server


@pytest.mark.slow  # 25 examples of every operation: the longest test of the unit tier; `make test` runs it
def test_the_service_keeps_its_own_schema(fake_service):
    # schemathesis's pytest plugin does not load under this pytest: drive hypothesis ourselves.
    from hypothesis import given

    api = schemathesis.openapi.from_url(f"{fake_service.url}/openapi.json")
    checks = [c for c in CHECKS.get_all() if c.__name__ != "positive_data_acceptance"]
    operations = [result.ok() for result in api.get_all_operations()]
    assert len(operations) >= 15

    for operation in operations:
        @given(case=operation.as_strategy())
        @hypothesis_settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck),
                             derandomize=True, database=None)
        def check(case):
            case.call_and_validate(checks=checks)

        check()

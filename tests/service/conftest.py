"""The module-scoped service of the service tests (see `service.helpers`)."""

from __future__ import annotations

import pytest
from service.helpers import ServiceProcess


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    svc = ServiceProcess(tmp_path_factory.mktemp("service"))
    yield svc
    svc.stop()

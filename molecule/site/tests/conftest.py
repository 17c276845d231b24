pytest_plugins = ["rigops_testinfra"]

from site_gateway import standin  # noqa: E402, F401 (the fixture of the tests that change the gateway's routing)
from site_prometheus import prometheus  # noqa: E402, F401 (a Prometheus reading the sentinel, for the alert tests)

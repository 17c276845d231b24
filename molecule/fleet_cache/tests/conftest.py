pytest_plugins = ["rigops_testinfra"]

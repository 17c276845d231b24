"""nvsim: the simulated NVIDIA hardware and kernel of a rigops sandbox host.

Pure Python 3 (3.11+) plus PyYAML, so that it runs with Debian's and Ubuntu's
``python3`` and ``python3-yaml`` inside the sandbox containers. The same package
is used by the hardware stand-ins (``lab/sandbox/hardware``: lspci, modprobe, ...)
and, as a private copy inside each stand-in ``.deb``, by ``nvidia-smi`` and
``nvidia-persistenced``. See ``lab/sandbox/driver_repo/README.md`` for what it models.
"""

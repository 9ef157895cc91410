"""gradsync: keeps the ranks of a distributed training job in lock-step
through the gradsyncd coordinator (see the repository's README).

This package is pure Python over libgradsync.so (ctypes). The framework
layer is gradsync.torch, a drop-in for horovod.torch:

    import gradsync.torch as hvd

`version` is the loaded library's gs_version(); `library_path` says which
file was loaded (GRADSYNC_LIB, the install prefix, or <repo>/build/lib).
"""

from . import _lib

version = _lib.text(_lib.lib.gs_version())
__version__ = version
library_path = _lib.path


def status_str(status):
    """The library's name and meaning of a gs_status code."""
    return _lib.text(_lib.lib.gs_status_str(int(status)))


__all__ = ["version", "library_path", "status_str"]

"""Sans-IO Kafka wire protocol for pidctl: bytes in, typed kio messages out, and back.

Nothing in this package touches sockets, trio or clocks; the server and the clients are thin
shells that move bytes between a transport and these functions.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("pidctl")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"

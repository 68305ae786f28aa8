"""Sans-IO Kafka wire protocol for pidctl: bytes in, typed kio messages out, and back.

Nothing in this package touches sockets, trio or clocks; the server and the clients are thin
shells that move bytes between a transport and these functions.
"""

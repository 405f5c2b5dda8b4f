"""The Core layer over pyzmq: sockets, submit results and the transport I/O thread.

Empty until the multi-process tier lands. This package never imports `zlink_actors`.
"""

__all__: list[str] = []

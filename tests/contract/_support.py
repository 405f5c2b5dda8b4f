"""What the contract areas share beyond `zlink_actors.testing`.

`WAIT` (the kit's) bounds every wait that is expected to succeed. `NEGATIVE_WAIT` is the
other kind: how long a test watches for something that must *not* happen, where its
absence cannot be observed any other way (a FIFO probe, a marker behind it). A correct
runtime passes such a check whatever the value; a wrong one is caught only if it
misbehaves within it.
"""

__all__ = ["NEGATIVE_WAIT"]

#: How long a test watches for something that must not happen.
NEGATIVE_WAIT = 0.2

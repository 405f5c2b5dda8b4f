"""The chaos run (`make chaos`, `python -m tests.chaos`): a redis-server, three node
processes and a driver, random faults, and a checker of the mesh's rules over a log of
every call and every handler run (docs/testing.md, "The chaos run")."""

"""The request-conformance suite (issue 27 §2): one set of tests for the request
contract, run on every path a request can take and with every terminator that can end it,
so no path keeps a rule of its own.

Paths (`_paths.PATHS`): `local` (a Spot on the caller's own Host), `node` (another node's
node handler, over the mesh), `channel` (a channel served by another node, select-one),
`global` (a global Spot another node owns, through a shared Location Store). Terminators
(`_terminators.TERMINATORS`): `submit()`, `submit_sync()` (on a thread of its own) and
`yield_()` (in an `async def` turn of a SpotWide Spot on the caller's Host). The fixtures
`world` and `caller` (conftest.py) run each test on every pair; the cases are in
`test_requests.py` (reply, handler errors, deadlines, cancellation, the serving Host's
shutdown, an interrupt, usage errors, races).

To add a path: write its world builder in `_paths.py` (Hosts started through the mesh
contract tests' helpers, the target and a second target on the serving Host) and add a
`Path` row with the data where it legitimately differs (what a draining or forced
shutdown of the serving Host looks like from the caller), each citing the doc that says
so. A path that breaks a rule the others keep is a bug: mark that case
`xfail(strict=True)` for that path, with the reason. docs/testing.md has the summary.
"""

"""The lab wing: what runs callers against the agent and measures it. Child agents and fleets
(`AgentProcess`, `Fleet`), the baresip softphone and the aiortc browser caller, the line simulator,
replay of hearing on a virtual clock, the quality judges, and every `callcenter bench`.

Product code never imports this package (`tests/test_layers.py` checks); only the command line's
`bench` and `demo` commands reach into it."""

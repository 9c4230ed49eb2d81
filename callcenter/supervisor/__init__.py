"""The supervisor's side: the control and event API on the agent server (and, later, its console)."""

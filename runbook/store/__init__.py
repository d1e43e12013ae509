"""What lives under state/, in git and in the process table.

Owns the workspace (root, config, plan, notes, state dir), the run ledger and its index, the locks,
a run's live state, metric series, step logs, git (gitops is the only module importing gitpython)
and the process table (procs).

May import: runbook.contract, runbook.plan and the ground floor. Must not import runbook.run,
report, commands, cli or mcp_server.
"""

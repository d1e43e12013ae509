"""What people read: notes, milestones, the brief, AGENTS.md, comparisons of runs, plots, templates.

May import: runbook.run, runbook.store, runbook.contract, runbook.plan and the ground floor. Must not
import runbook.commands, cli or mcp_server.
"""

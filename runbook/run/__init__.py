"""Running a phase: the next action, the run session, executors, the supervisor, cancel, judge.

Owns where a plan stands (planstate) and which phase runs next (select), the `next` service
(runner, session), where steps run (executor: the interface; local; slurm), the detached supervisor,
cancel, forget/reset (unrecord) and the environment fingerprint.

May import: runbook.store, runbook.contract, runbook.plan and the ground floor. Must not import
runbook.report, commands, cli or mcp_server.
"""

"""The plan document as text, pure: parse, validate, criteria, markers, write-back, resolve.

Owns the Markdown mechanics (mdtext, markers), the `Pass:` language (criteria, crossref), var
substitution and its quoting (resolve, shellctx, overrides), the `Resources:` line, and write-back
(text -> text). Every function here takes text or models and returns text or models: no file, git,
process or clock.

May import: the ground floor (runbook.errors, model, formatting, files, redact). Must not import
runbook.contract, store, run, report, commands, cli or mcp_server.
"""

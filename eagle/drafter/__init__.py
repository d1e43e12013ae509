"""The EAGLE-3 draft model: the model (the only module importing speculators), checkpoint layouts
(one reader, one writer), static checks, import of published layouts.

May import: the ground floor (eagle.target, prompts, toy, distributed, metrics, fsutil, common).
Must not import eagle.data, train, decode, serving, commands or cli.
"""

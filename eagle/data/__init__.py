"""Data for the drafter: prepare (conversations -> token ids), turns, regenerate, vocab, extract,
the hidden-state capture and the hidden-state files (speculators' offline format).

May import: eagle.serving, eagle.drafter and the ground floor. Must not import eagle.train,
eagle.decode, eagle.commands or eagle.cli.
"""

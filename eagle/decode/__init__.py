"""Decoding with the drafter: the decoder interface and factory, the fast (static-cache) decoder,
the generic decoder, draft inference, the kernels, evaluate, probe and bench.

May import: eagle.data, eagle.serving, eagle.drafter and the ground floor. Must not import
eagle.train, eagle.commands or eagle.cli.
"""

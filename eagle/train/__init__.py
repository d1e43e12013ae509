"""Training the drafter: the trainer, its step functions, packed batches (dataset), online hidden
states, per-document attention forms, the CUDA-graph step and the step log.

May import: eagle.decode, eagle.data, eagle.serving, eagle.drafter and the ground floor. Must not
import eagle.commands or eagle.cli.
"""

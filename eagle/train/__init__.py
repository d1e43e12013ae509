"""Training the drafter: the Trainer, its config, its step functions and step hooks, packed batches
(dataset), online hidden states, per-document attention forms, the CUDA-graph step and the step log.

May import: eagle.decode, eagle.data, eagle.serving, eagle.drafter and the ground floor. Must not
import eagle.commands or eagle.cli.
"""

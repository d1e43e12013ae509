"""A bridge for `eagle train` only, until its verb moves to eagle/commands/train.py: the trainer
(eagle/train/trainer.py) still defines its click command and imports these edges from here. Every
other verb imports eagle/commands/_options.py directly; delete this module when train's verb moves."""

from eagle.commands._options import device_option, finish, json_option, refusals, trust_remote_code_option

__all__ = ["device_option", "finish", "json_option", "refusals", "trust_remote_code_option"]

"""The Lightning face: ``OptPipeStrategy``, its launcher, its registration and the training step.

Imports the rooms below it (``scheduling``, ``records``, ``runtime``, ``planning``); none imports it.
"""

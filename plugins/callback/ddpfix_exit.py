"""Callback: ansible-playbook's exit without the interpreter's last garbage-collection passes (ddpfix's runs only).

When a playbook is over (its stats are out, its temporary files removed), Python's finalization still runs full
garbage collections over every object ansible-playbook holds (its plugins, templates, results), and the caller
waits for them: 0.2-0.3 s of a 4-node audit on a 2-core controller, longer than any task but the facts one. This
callback freezes those objects (`gc.freeze`) in an exit handler, so the finalization's collections have nothing to
walk. Nothing else changes: the other exit handlers run (logging's flush, multiprocessing's cleanup), the standard
streams are flushed, the exit status is ansible-playbook's own. Objects only in reference cycles are not finalized at
exit then, which CPython does not promise anyway.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = """
name: ddpfix_exit
type: aggregate
short_description: end ansible-playbook without the interpreter's final garbage collection passes
description:
  - After the playbook's stats, registers an exit handler that calls C(gc.freeze()), so Python's finalization does
    not walk every object ansible-playbook kept. The exit status and every other exit handler are unchanged.
  - ddpfix enables it for its own runs (ANSIBLE_CALLBACKS_ENABLED, after the user's own callbacks).
requirements:
  - enabled in callbacks_enabled
"""

import atexit
import gc

from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "ddpfix.cluster.ddpfix_exit"
    CALLBACK_NEEDS_ENABLED = True

    def v2_playbook_on_stats(self, stats):
        atexit.register(gc.freeze)

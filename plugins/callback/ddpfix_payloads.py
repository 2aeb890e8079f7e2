"""Callback: the module payloads a ddpfix run will send, built while the play starts (ddpfix's runs only).

Before a task's first node is dialled, Ansible builds the module's payload (AnsiballZ: the module and every
module_util it imports, each parsed to find the next, zipped) once per ansible-playbook run, in the first worker
that needs it, while the task's other workers wait for it on a file lock. For the facts module of `ddpfix audit`
that is about 0.25 s of a 4-node audit on a 2-core controller, on the path to the first node; the tasks before it
(the cluster view, the facts plan) leave the other core idle. This callback builds the payloads of the modules the
ddpfix CLI names in DDPFIX_PAYLOADS in a detached process when the playbook starts, into the same per-run cache
(Ansible's `ansiballz_cache` in its local temporary directory) under the same lock, so the workers find it built.

Nothing else changes: a payload not built in time (or not at all: the builder gives up after 60 s, or on any error)
is built by the worker as before; the builder writes nothing but the cache file, puts its standard streams on
/dev/null and takes no other lock, and ansible-playbook ends it when it exits. Ansible itself looks up, builds and
reads the cache (`modify_module`).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = """
name: ddpfix_payloads
type: aggregate
short_description: build the module payloads a ddpfix run sends while the playbook starts
description:
  - When the playbook starts, builds the AnsiballZ payloads of the modules named in the DDPFIX_PAYLOADS environment
    variable (comma-separated fully qualified module names) in a detached process, into ansible-playbook's own
    per-run payload cache, so the first task that sends them does not wait for the build.
  - ddpfix enables it for its own runs (ANSIBLE_CALLBACKS_ENABLED, after the user's own callbacks).
requirements:
  - enabled in callbacks_enabled
"""

import atexit
import contextlib
import os
import re
import signal

from ansible.plugins.callback import CallbackBase

PAYLOADS_ENV = "DDPFIX_PAYLOADS"
_FQCN = re.compile(r"^[a-z0-9_]+\.[a-z0-9_]+\.[a-z0-9_]+$")
_GIVE_UP_S = 60


def payload_names(value):
    """The module names of DDPFIX_PAYLOADS that are fully qualified module names (others are ignored)."""
    return [n for n in (p.strip() for p in (value or "").split(",")) if _FQCN.match(n)][:8]


def build_payload(name):
    """Ansible's own build of the module's payload into this run's cache (modify_module): the worker that sends it
    then reads it from there. Returns the module's path, or None when Ansible does not find the module."""
    from ansible import constants as C
    from ansible.executor.module_common import modify_module
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import module_loader
    from ansible.template import Templar

    found = module_loader.find_plugin_with_context(name)
    if not found.resolved or not found.plugin_resolved_path:
        return None
    task_vars = {"ansible_python_interpreter": "/usr/bin/python3"}  # the shebang is not cached: no discovery here
    modify_module(module_name=name, module_path=found.plugin_resolved_path, module_args={},
                  templar=Templar(loader=DataLoader(), variables=task_vars), task_vars=task_vars,
                  module_compression=C.config.get_config_value("DEFAULT_MODULE_COMPRESSION", variables=task_vars))
    return found.plugin_resolved_path


def _start_builder():
    """Fork the builder: its PID in ansible-playbook, 0 in the builder (standard streams on /dev/null, Ctrl-C
    ignored, given up after _GIVE_UP_S). ansible-playbook ends it and reaps it when it exits (atexit), before its own
    temporary directory, where the cache is, is removed."""
    pid = os.fork()
    if pid:
        atexit.register(_end_builder, pid)
        return pid
    try:
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the user's Ctrl-C is for the run, not for this builder
        signal.alarm(_GIVE_UP_S)
    except BaseException:  # noqa: BLE001 - the builder never returns into ansible-playbook's code
        os._exit(0)
    return 0


def _end_builder(pid):
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.waitpid(pid, 0)


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "ddpfix.cluster.ddpfix_payloads"
    CALLBACK_NEEDS_ENABLED = True

    def v2_playbook_on_start(self, playbook):
        names = payload_names(os.environ.get(PAYLOADS_ENV))
        if not names or _start_builder():
            return
        try:
            for name in names:
                build_payload(name)
        except BaseException:  # noqa: BLE001 - best effort: the worker builds what is not in the cache
            pass
        os._exit(0)

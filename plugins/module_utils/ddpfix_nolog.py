"""An AnsibleModule whose content-carrying arguments stay out of every log: the env block (I(body)) and its values
(I(values)) are no_log for the invocation entry in the node's journal (C(NOT_LOGGING_PARAMETER)), and the arguments
returned to the controller (C(invocation)) show them redacted like the diff. They are not declared C(no_log) in the
argument spec: that would also blank every occurrence of their text in the result (the whole block in the diff, and
every short value such as C(1) of I(values))."""

from __future__ import absolute_import, division, print_function

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_envfile import redact, redact_values

__metaclass__ = type

#: The arguments that carry the env file's content.
CONTENT_ARGS = ("values", "body")


class ContentModule(AnsibleModule):
    def _log_invocation(self):
        spec = self.argument_spec
        self.argument_spec = dict(spec, **{k: dict(spec[k], no_log=True) for k in CONTENT_ARGS if k in spec})
        try:
            super()._log_invocation()
        finally:
            self.argument_spec = spec

    def _return_formatted(self, kwargs):
        if "invocation" not in kwargs:
            shown = dict(self.params)
            if shown.get("body") is not None:
                shown["body"] = redact(str(shown["body"]))
            if shown.get("values") is not None:
                shown["values"] = redact_values({str(k): str(v) for k, v in shown["values"].items()})
            kwargs["invocation"] = {"module_args": shown}
        super()._return_formatted(kwargs)

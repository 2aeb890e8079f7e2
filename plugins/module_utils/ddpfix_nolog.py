"""An AnsibleModule whose content-carrying arguments stay out of every log: the env block (I(body)) and its values
(I(values)) are no_log for the invocation entry in the node's journal (C(NOT_LOGGING_PARAMETER)), and the arguments
returned to the controller (C(invocation)) show them redacted like the diff. Their text is not kept in
C(no_log_values): that would blank every occurrence of it in the result (the whole block in the diff, and every short
value such as C(1) of I(values))."""

from __future__ import absolute_import, division, print_function

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddpfix.cluster.plugins.module_utils.ddpfix_envfile import redact, redact_values

__metaclass__ = type

#: The arguments that carry the env file's content.
CONTENT_ARGS = ("values", "body")


class ContentModule(AnsibleModule):
    """AnsibleModule that keeps the content arguments out of every log, through AnsibleModule's public interface only:
    they are made C(no_log) in the argument spec (the journal's invocation entry shows C(NOT_LOGGING_PARAMETER)),
    their text is then taken out of C(no_log_values) again (so it does not blank every occurrence of that text in the
    result), and the arguments returned to the controller (C(invocation)) show them redacted like the diff."""

    def __init__(self, argument_spec, **kwargs):
        spec = dict(argument_spec)
        for k in CONTENT_ARGS:
            if k in spec:
                spec[k] = dict(spec[k], no_log=True)
        super().__init__(argument_spec=spec, **kwargs)
        self.no_log_values.clear()  # the content arguments are the only no_log ones: shown redacted (_shown) instead

    def _shown(self, kwargs):
        if "invocation" not in kwargs:
            shown = dict(self.params)
            if shown.get("body") is not None:
                shown["body"] = redact(str(shown["body"]))
            if shown.get("values") is not None:
                shown["values"] = redact_values({str(k): str(v) for k, v in shown["values"].items()})
            kwargs["invocation"] = {"module_args": shown}
        return kwargs

    def exit_json(self, **kwargs):
        super().exit_json(**self._shown(kwargs))

    def fail_json(self, msg, **kwargs):
        super().fail_json(msg, **self._shown(kwargs))

"""``python -m ddpfix.rules``: print the rule registry (``--markdown``: the README's findings table)."""

from ddpfix.rules.registry import main

raise SystemExit(main())

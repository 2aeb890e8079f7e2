"""The rules: the registry (``registry``) and the checks that report each finding id."""

"""Plain data: the types every layer shares; imports nothing of ddpfix."""

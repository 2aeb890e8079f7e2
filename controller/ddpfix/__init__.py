"""ddpfix: find and fix host causes of multi-node torch.distributed failures."""

__version__ = "0.1.0"

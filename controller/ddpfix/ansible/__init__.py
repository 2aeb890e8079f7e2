"""Everything that talks to Ansible: its environment and configuration, run directories, the run and its results."""

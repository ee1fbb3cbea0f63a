"""Workspace backends, the JupyterHub spawner, the snapshot store and GPU allocation."""

"""JupyterHub engines: the generated hub config, the portal-backed authenticator, the spawner
that starts JupyterLab inside an attempt's existing workspace container, and its tunnel."""

"""The JupyterHub side of human attempts: their hub sessions, and the watch that pauses attempts
while the hub is down or the participant is idle."""

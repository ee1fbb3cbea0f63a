"""Workspaces: placing them on hosts (GPUs, disk), the egress gateway and its events, network
isolation, and what is put in a workspace when it starts (tokens, terminal recording)."""

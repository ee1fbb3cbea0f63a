"""Egress control of workspaces: a filtering TLS proxy (mitmproxy with `addon.py`) per host.

`rules` (standard library only, shared with the addon, which runs in the proxy's own venv) decides
whether a URL may be fetched; `proxy` runs mitmdump and keeps its per-workspace configuration;
`setup` puts the proxy's CA and settings into a workspace. Every request is written as one JSON
line to the proxy's event log, which the domain layer ingests into the database.
"""

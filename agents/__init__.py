"""Agent scaffolds and the external-agent interface."""

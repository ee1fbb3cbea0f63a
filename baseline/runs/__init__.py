"""Agent runs: the built-in loop, command agents and their model passthrough and keys, the worker
that drives them, transcripts, the blacklist monitor, and the workspace API agents call."""

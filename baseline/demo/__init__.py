"""The demo: the demo study, the live demo that runs it, and the recorded model it talks to."""

"""Environment facts, compatibility checks and probes (``scalpel env``)."""

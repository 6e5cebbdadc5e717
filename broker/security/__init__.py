"""Authentication (tokens) and TLS."""

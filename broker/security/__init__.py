"""Authentication (token, basic, tls; the anonymous role), authorization and TLS."""

"""Who may do what: identity (identity.py), access rules (rules.py), the audit log (audit.py)
and per-identity rate limits (ratelimit.py)."""

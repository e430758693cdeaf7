"""Bytes out, with no I/O: the codec, the per-connection protocol state (`Session`), tokens."""

"""Bytes out, with no I/O: the codec, the per-connection protocol state (`Session`, on the base
`AttachedSession` it shares with pvws's session), tokens."""

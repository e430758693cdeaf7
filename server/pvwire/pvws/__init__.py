"""The pvws-compatible endpoint (`/pvws/pv`, pvws's JSON; DESIGN.md section 7a), as one package.

The protocol, with no I/O, as wire/ is: `session.py` (one connection), `messages.py` (what a
client sends), `pv.py` (what a connection keeps per PV), `encoder.py` (updates as JSON, made once
for every client), `frames.py` (WebSocket text frames for one write). Above the hub, as api/ is:
`endpoint.py` (admission, `/pvws/pvget` and the inspection pages, read from `snapshot.py`),
`scripts.py` (pvws's browser client, `js/`) and `wsprotocol.py` (uvicorn's WebSocket protocol
with several frames in one write).
"""

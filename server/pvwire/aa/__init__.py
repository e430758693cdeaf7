"""The EPICS Archiver Appliance's retrieval API, served from pvwire's recent history
(DESIGN.md section 7g; docs/ARCHIVER.md): the plots that exist (cs-web-lib, Grafana's data
source, Phoebus' Data Browser) read pvwire's history as they read an archiver's.

- `pb`: the PB/HTTP format (`getData.raw`), its encoder and a bounded reader for archivers'
  answers, which are network input like any other;
- `times`: `from`, `to` and `at` as the Archiver Appliance parses them;
- `operators`: the post-processors (`mean_60(PV)`...), computed from a channel's rows;
- `answers`: the JSON, CSV and PB bodies, a piece at a time;
- `endpoint`: the routes under `--aa-prefix` (`/retrieval` by default), above the hub as `api/` is.

All but `endpoint` are I/O-free and import nothing above `model.py`, as `wire/` does."""

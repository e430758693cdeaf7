"""Every limit the server enforces, in one table: the code reads its numbers from here, and
PROTOCOL.md's limits section and the GraphQL schema's descriptions are generated from it
(`python scripts/generate_protocol.py`; tests/test_limits.py fails when they are stale).

A limit with `setting` is the default of the `Settings` field of that name (a TOML key, a
`PVWIRE_<NAME>` variable, a `pvwire serve` flag); the others are fixed by the protocol or the code.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ALL_MODE_PER_CHANNEL",
    "ALL_MODE_PER_VIEW",
    "BACKFILL_PASSES",
    "HISTORY_ARRAY_BYTES",
    "HISTORY_ARRAY_LIMIT",
    "HISTORY_MESSAGE_ROWS",
    "LIMITS",
    "MAX_BACKFILL_S",
    "MAX_COLUMNS",
    "MAX_ID_LENGTH",
    "MAX_PUT_TIMEOUT_S",
    "MAX_QUERY_TOKENS",
    "MAX_RATE_HZ",
    "MAX_SEARCH_RESULTS",
    "MAX_TOKEN_BYTES",
    "MAX_TOKEN_PAYLOAD_BYTES",
    "MIN_PIXELS",
    "PVA_IDENTITY_ADDRESSES",
    "PVA_IDENTITY_CHANNELS",
    "PVA_IDENTITY_CONNECTIONS",
    "PVA_IDENTITY_IDLE_S",
    "PVA_IDENTITY_MESSAGE_BYTES",
    "SIM_MAX_COMPUTED_PER_S",
    "SIM_MAX_STORES",
    "Limit",
    "default",
    "integer",
    "markdown",
    "number",
    "shown",
]


@dataclass(frozen=True, slots=True)
class Limit:
    name: str  # the Settings field when `setting`, else a name of its own in lower case
    value: int | float
    unit: str
    what: str  # what is bounded
    over: str  # what the server does beyond it
    setting: bool = False


_MIB = 1 << 20

LIMITS: tuple[Limit, ...] = (
    # --- every WebSocket connection (/stream and /pvws/pv) ---
    Limit("max_connections_per_address", 100, "connections",
          "open connections from one client address, HTTP and WebSocket together, counted at "
          "accept (behind a trusted proxy: under the address it forwards, once a request's "
          "headers are in)", "HTTP 429, connection closed",
          setting=True),
    Limit("send_budget", 4 * _MIB, "bytes", "frames queued for one connection",
          "pending changes merge instead (section 9)", setting=True),
    Limit("stall_timeout_s", 10.0, "s", "a connection's queue making no progress",
          "close 4008 SLOW", setting=True),
    Limit("heartbeat_s", 15.0, "s", "the server's silence on a connection (`heartbeat_ms` in "
          "HELLO)", "a `HEARTBEAT` is sent", setting=True),
    Limit("ws_ping_interval_s", 20.0, "s", "between WebSocket pings", "", setting=True),
    Limit("ws_ping_timeout_s", 20.0, "s", "a WebSocket ping waiting for its pong", "close 1011"),
    Limit("close_timeout_s", 60.0, "s",
          "a close frame waiting behind data the client has not read (the session is released "
          "at once)", "the connection is dropped"),
    Limit("shutdown_close_timeout_s", 1.0, "s", "a close frame when the server stops",
          "the connection is dropped"),
    Limit("shutdown_grace_s", 3.0, "s", "HTTP requests finishing when the server stops",
          "they are cancelled"),
    # --- the drain on SIGTERM (core/drain.py; docs/OPERATIONS.md, "The drain") ---
    Limit("drain_delay_s", 5.0, "s", "serving on after SIGTERM with `/readyz` answering 503, "
          "while load balancers stop routing here", "the drain's closes begin", setting=True),
    Limit("drain_window_s", 20.0, "s", "the drain closing every WebSocket, paced evenly over "
          "it", "the process exits", setting=True),
    Limit("drain_jitter_max_s", 1.0, "s", "the delay a `4012 DRAINING` close asks its client to "
          "spread its reconnect over (the time between two of the drain's closes times the number "
          "closed in the same pass, at most this)",
          "clients reconnect within it"),
    Limit("drain_close_wait_s", 2.0, "s", "the drain waiting for its last closes to go out "
          "before the server stops", "the server's shutdown closes what is left with 1012"),
    # --- the stream (/stream) ---
    Limit("max_in_bytes", _MIB, "bytes", "one client message on the stream (announced in HELLO)",
          "close 1009 TOO_BIG", setting=True),
    Limit("max_channels_per_connection", 100_000, "channels",
          "channels over all attachments of one stream connection; PVs of one `/pvws/pv` "
          "connection", "ERROR 4413; pvws `error`", setting=True),
    Limit("max_attachments_per_connection", 1_000, "attachments",
          "attachments of one stream connection at once", "ERROR 4413", setting=True),
    Limit("open_ms_per_pass", 5.0, "ms",
          "time spent opening the channels of `/stream` ATTACHes and `/pvws/pv` subscribes per "
          "event-loop pass, over all connections (each in turns of 10 channels)",
          "the rest open at the next passes (ATTACHED once all of a token's are open; each pvws "
          "PV answered as it opens)"),
    Limit("stream_requests_waiting", 1_000, "requests",
          "requests of one stream connection waiting behind its ATTACHes whose channels are "
          "opening (answers go in the order of the requests), and at most `max_in_bytes` bytes "
          "of them together", "close 4008 SLOW"),
    Limit("max_token_bytes", _MIB, "bytes", "one token, in `ATTACH`", "ERROR 4401"),
    Limit("max_token_payload_bytes", 16 * _MIB, "bytes", "a token's payload once inflated",
          "ERROR 4401"),
    Limit("max_value_depth", 64, "levels", "arrays and maps nested in one value (section 4)",
          "the channel turns FAILED"),
    Limit("all_mode_per_channel", 1_000, "updates",
          "`ALL` mode: updates of one channel kept between two ticks",
          "later ones dropped; the serial counts them"),
    Limit("all_mode_per_view", 100_000, "entries",
          "`ALL` mode: entries of one subscription waiting for its next `DATA`",
          "oldest dropped; the serial counts them"),
    # --- /pvws/pv ---
    Limit("pvws_max_held_errors", 16, "messages",
          "`error` messages kept for a pvws client not yet known to read them",
          "later ones dropped"),
    Limit("pvws_put_timeout_s", 5.0, "s", "a pvws `write`", "the write fails"),
    # --- MJPEG ---
    Limit("mjpeg_max_viewers", 200, "viewers", "MJPEG connections at once in one process",
          "HTTP 503"),
    Limit("mjpeg_first_frame_s", 10.0, "s", "a new MJPEG viewer waiting for its first picture",
          "HTTP 504"),
    # --- registration (GraphQL subscribe) and tokens ---
    Limit("max_channels_per_subscription", 10_000, "ids",
          "ids in one `subscribe`, `channels` or `putMany` (at least 1 for `subscribe`); names "
          "in one `/pvws/pv` `subscribe`",
          "GraphQL error TOO_MANY_CHANNELS (none: BAD_REQUEST); pvws `error`, none opened",
          setting=True),
    Limit("max_id_length", 1_024, "characters", "one channel id", "BAD_CHANNEL_ID"),
    Limit("max_rate_hz", 1_000.0, "Hz", "`subscribe` option `maxRate` (0 = every tick)",
          "BAD_REQUEST"),
    # A day: as far back as the coarsest history tier reaches (core/history/layout.py TIERS).
    Limit("max_backfill_s", 86_400.0, "s", "`subscribe` option `backfill`", "BAD_REQUEST"),
    Limit("max_columns", 100_000, "columns",
          "`subscribe` option `maxColumns` (0 = whole arrays; `LATEST` mode only)",
          "BAD_REQUEST"),
    Limit("min_pixels", 1_024, "pixels",
          "`subscribe` option `maxPixels`, the least it may be other than 0 (0 = whole images; "
          "`LATEST` mode only)", "BAD_REQUEST"),
    Limit("token_ttl_s", 24 * 3600.0, "s",
          "a token's lifetime (shorter when the caller's credentials expire first)",
          "ERROR 4402 on `ATTACH`", setting=True),
    # --- the control plane (GraphQL) ---
    Limit("max_query_depth", 12, "levels", "nesting of one GraphQL query", "GraphQL error",
          setting=True),
    Limit("max_query_tokens", 20_000, "tokens", "GraphQL tokens in one request", "GraphQL error"),
    Limit("max_query_cost", 25_000, "",
          "one request: each field 1 (each alias and fragment use again), each id in `ids` or "
          "`puts` 1", "QUERY_TOO_COSTLY", setting=True),
    Limit("max_cost_per_s", 100_000.0, "per s", "query cost per identity per second",
          "RATE_LIMITED", setting=True),
    Limit("max_graphql_elements", 100_000, "elements",
          "array elements in one GraphQL response", "TOO_LARGE", setting=True),
    Limit("max_puts_per_s", 20.0, "puts/s", "puts per identity per second (bursts of twice it)",
          "RATE_LIMITED", setting=True),
    Limit("max_put_timeout_s", 60.0, "s", "a put's `timeout`", "clamped to it"),
    Limit("get_timeout_s", 3.0, "s", "a `/pvws/pvget` read of a channel not monitored yet",
          "HTTP 504", setting=True),
    Limit("max_search_results", 10_000, "ids", "`search`'s `limit`", "clamped to it"),
    # --- identities ---
    Limit("rate_limited_identities", 10_000, "identities",
          "identities whose rates (puts, query cost) are tracked at once",
          "the least recently seen is forgotten"),
    Limit("jwt_leeway_s", 60.0, "s", "clock skew allowed for a JWT's `exp` and `nbf`",
          "the JWT is refused", setting=True),
    Limit("oidc_min_interval_s", 10.0, "s",
          "between fetches of the issuer's keys for an unknown key id",
          "the token is refused without a fetch", setting=True),
    Limit("identity_name_bytes", 255, "bytes",
          "a user name sent to an IOC (`--forward-identity`)", "the put is refused"),
    Limit("ca_identity_circuits", 256, "circuits",
          "CA circuits for puts as a user, one per (user, IOC) at once",
          "the least recently used is closed (its puts in flight fail)"),
    Limit("ca_identity_idle_s", 30.0, "s", "a CA circuit for puts as a user without a put",
          "closed"),
    Limit("ca_identity_channels", 64, "channels", "channels kept open on one such circuit",
          "the least recently used is cleared"),
    Limit("pva_identity_connections", 256, "connections",
          "PVA connections held for puts as a user, one per (user, IOC server)",
          "the least recently used is closed (its puts in flight fail)"),
    Limit("pva_identity_idle_s", 30.0, "s", "a PVA connection for puts as a user without a put",
          "closed"),
    Limit("pva_identity_channels", 64, "channels", "channels kept open on one such connection",
          "the least recently used is destroyed"),
    Limit("pva_identity_message_bytes", _MIB, "bytes",
          "one message from an IOC on such a connection", "the connection is closed"),
    Limit("pva_identity_addresses", 4_096, "names",
          "server addresses remembered per PV name for those puts",
          "the least recently used is searched again"),
    Limit("pva_identity_type_depth", 20, "levels",
          "nesting of a type description from an IOC on such a connection",
          "refused as malformed"),
    Limit("pva_identity_type_nodes", 16_384, "nodes",
          "nodes of one type description from an IOC on such a connection, a cached type "
          "counted as what it refers to (an NTNDArray has ~70)",
          "refused while it is read: the connection is closed"),
    Limit("pva_identity_type_cache_bytes", 4 * _MIB, "bytes",
          "types an IOC caches on such a connection, each counted unfolded at 224 bytes a node "
          "plus its names", "the connection is closed"),
    Limit("pva_identity_text_bytes", 512, "bytes",
          "words kept of an IOC's status or MESSAGE on such a connection", "the rest is dropped"),
    Limit("pva_identity_message_lines", 10, "lines",
          "IOC MESSAGEs logged at once, over all such connections",
          "one more per `pva_identity_message_interval_s`; the others are counted"),
    Limit("pva_identity_message_interval_s", 10.0, "s",
          "between IOC MESSAGEs logged once the burst is spent", "counted, not logged"),
    # A server with an introspection cache (pvAccessCPP) names a type it sent by its key from
    # then on, also one sent in a reply that came after its request was given up.
    Limit("pva_identity_late_inits", 64, "requests",
          "PUT INITs given up on one such connection whose late reply still has its types read "
          "into the connection's type cache",
          "the oldest is forgotten: its reply is dropped unread"),
    # --- recent history ---
    Limit("history_mb", 128.0, "MiB",
          "memory for every channel's recent history (0: none)",
          "channels beyond it record none until space is free", setting=True),
    Limit("history_array_max", 0, "elements",
          "a numeric array channel's length for the server to keep its recent history (0: "
          "arrays keep none; at most `history_array_limit`)", "that channel's arrays are not "
          "kept (`history`: NO_HISTORY, saying why)", setting=True),
    Limit("history_array_limit", 1_024, "elements",
          "the most `history_array_max` may be (a bucket holds three frames)",
          "the server refuses to start"),
    Limit("history_array_bytes", 4 * _MIB, "bytes",
          "one array channel's recent history (its rings hold fewer frames and buckets to fit)",
          "fewer frames and buckets"),
    # --- upstream channels ---
    Limit("linger_s", 5.0, "s", "an unwatched channel's monitor kept open",
          "the monitor closes", setting=True),
    Limit("not_found_s", 5.0, "s", "a channel searching with no server answering",
          "the channel turns NOT_FOUND (and keeps searching)", setting=True),
    Limit("pva_queue_size", 16, "updates",
          "updates queued per PVA monitor, here and at the IOC", "merged into the last one",
          setting=True),
    Limit("pva_max_pops", 16, "updates",
          "updates taken from one PVA monitor before the others get their turn",
          "the rest wait for the next pass"),
    Limit("pva_max_types", 4_096, "names", "PVA put types remembered",
          "the least recently used is forgotten"),
    Limit("ca_queue_size", 16, "updates",
          "updates of one CA monitor held while the event loop is behind",
          "the oldest are dropped; the serial counts them"),
    Limit("ca_queue_bytes", 16 * _MIB, "bytes",
          "what those updates of one CA monitor may hold (a large array's are fewer)",
          "the oldest are dropped; the serial counts them"),
    Limit("ca_max_enum_choices", 4_096, "names", "CA enum labels remembered for puts",
          "the least recently used is forgotten"),
    Limit("ca_desc_timeout_s", 2.0, "s", "a CA monitor waiting for its `.DESC`",
          "metadata is published without a description"),
    Limit("loc_max_pvs", 10_000, "channels", "`loc://` PVs kept at once",
          "the oldest nobody watches are forgotten"),
    # --- sim:// channels ---
    Limit("sim_max_rate", 1_000.0, "Hz", "a sim channel's `rate`", "BAD_CHANNEL_ID",
          setting=True),
    Limit("sim_max_length", 2048 * 2048, "elements", "a sim waveform's or image's elements",
          "BAD_CHANNEL_ID", setting=True),
    Limit("sim_max_bytes_per_s", 200e6, "bytes/s", "a sim channel's bytes per second",
          "BAD_CHANNEL_ID", setting=True),
    Limit("sim_max_stores", 10_000, "channels",
          "writable `sim://value/NAME` and `sim://string/NAME` instances kept",
          "the least recently written that nobody monitors are forgotten; "
          "BAD_CHANNEL_ID for a new one when all are monitored"),
    Limit("sim_max_computed_per_s", 1_000_000, "elements/s",
          "elements a computed Phoebus wave (`sim://sinewave`...) makes per second",
          "BAD_CHANNEL_ID"),
    Limit("sim_image_cache_bytes", 256 * _MIB, "bytes", "sim image patterns cached",
          "the least recently used are dropped"),
    Limit("sim_table_cache_bytes", 128 * _MIB, "bytes", "sim waveform tables cached",
          "the least recently used are dropped"),
    # --- the server ---
    Limit("failures_logged_once", 10_000, "units",
          "failing channels, views and sessions remembered so that each is logged once",
          "a failure of another one is logged each time"),
    Limit("ready_max_loop_lag_s", 5.0, "s", "the event loop's lag for `/readyz` to say ready",
          "`/readyz` answers 503"),
    Limit("refusal_log_sources", 1_024, "sources",
          "clients (addresses; users for puts) whose refusals are written to the audit file "
          "each under its own flood bound",
          "the least recently refused is forgotten; its lines left out still summarised"),
    Limit("refusal_log_burst", 20, "lines",
          "audit lines of refusals for one reason and source written at once, then "
          "`refusal_log_rate` a second", "counted, and summarised every `refusal_log_interval_s`"),
    Limit("refusal_log_rate", 1.0, "lines/s",
          "audit lines of refusals for one reason and source after its burst",
          "counted, and summarised every `refusal_log_interval_s`"),
    # Above one source's rate, so that one source's flood never hides another's refusals.
    Limit("refusal_log_reason_burst", 100, "lines",
          "audit lines of refusals for one reason written at once, whatever their sources, "
          "then `refusal_log_reason_rate` a second",
          "counted, and summarised every `refusal_log_interval_s`"),
    Limit("refusal_log_reason_rate", 2.0, "lines/s",
          "audit lines of refusals for one reason after its burst, whatever their sources",
          "counted, and summarised every `refusal_log_interval_s`"),
    Limit("refusal_log_interval_s", 10.0, "s",
          "between summary lines of one reason's refusals left out", ""),
    # --- the client's address behind trusted proxies (access/forwarded.py) ---
    Limit("forwarded_hops", 20, "entries",
          "`X-Forwarded-For` (or `Forwarded`) entries read from the right for a request from "
          "a `--trusted-proxy`", "the last one read is the client"),
    Limit("forwarded_entry_bytes", 256, "bytes", "one `X-Forwarded-For` (or `Forwarded`) entry",
          "the walk ends: the last trusted proxy is the client"),
    # RFC 6177: an IPv6 site is given a /64 at least, and picks any of its 2^64 addresses.
    Limit("ipv6_bound_prefix", 64, "bits",
          "leading bits of an IPv6 client address that every bound kept per address counts it "
          "under (access/bound_key.py; IPv4 by the whole address)",
          "the addresses of one /64 share one address's bounds"),
    # --- the status PVs (status/, `--status-prefix`) ---
    Limit("status_period_s", 1.0, "s", "between two readings of the status PVs' figures",
          "they are read again; a PV is posted when its value or alarm changed"),
    Limit("status_window_s", 10.0, "s",
          "the span of the status PVs' rates and `tickP99`", "older readings are forgotten"),
    # --- HTTP request bodies (api/body_limit.py) ---
    # 4 MiB: a `putMany` of `max_graphql_elements` float64 in their longest JSON form (~25
    # bytes each, 2.5 MB) with room for the query; a GraphQL query itself needs a few KiB.
    Limit("max_request_bytes", 4 * _MIB, "bytes",
          "one HTTP request body (`/graphql` and every other route), on `Content-Length` "
          "before reading it and while counting a chunked one, before authentication",
          "HTTP 413, TOO_LARGE, connection closed", setting=True),
    # --- MJPEG feeds (/mjpeg): options are rounded to a few levels, so these bound the work ---
    Limit("mjpeg_feeds_per_channel", 4, "feeds",
          "distinct option sets (after rounding) encoded for one channel at once",
          "HTTP 503 naming the option sets in use"),
    Limit("mjpeg_feeds_per_address", 8, "feeds",
          "feeds opened by one client address and open at once", "HTTP 429"),
    Limit("mjpeg_encode_threads", 2, "threads",
          "JPEG encodes running at once, in threads of their own (at most one more waits per "
          "feed)", "a feed encodes only its newest image"),
    Limit("mjpeg_max_pixels", 1 << 24, "pixels", "MJPEG option `maxPixels`", "HTTP 400"),
    Limit("mjpeg_max_fps", 50.0, "frames/s", "MJPEG option `fps`", "HTTP 400"),
    # --- pvws (/pvws/pv) per connection ---
    Limit("pvws_writes_in_flight", 64, "writes",
          "`write`s of one `/pvws/pv` connection not yet done",
          "pvws `error` naming the limit; that write is not made"),
    Limit("pvws_image_bytes_per_s", 1.5e6, "bytes/s",
          "image frames (arrays of 2 or more dimensions) sent to one `/pvws/pv` connection, "
          "over all its PVs (0: every frame)",
          "a frame waits, replaced by newer ones, until the connection's budget has room"
          , setting=True),
    # --- backfill, produced under the send budget ---
    Limit("history_message_rows", 512, "rows",
          "one `HISTORY` message (an array channel's: rows x elements, at least one row)",
          "the channel's past goes on in the next message"),
    Limit("backfill_passes", 4, "passes",
          "passes over an attachment's channels sending what they recorded while its "
          "backfill was being read (section 2.8)",
          "the backfill ends: a gap row where each channel's unsent rows begin, then the "
          "snapshot"),
    # --- the OIDC provider's keys (access/oidc.py) ---
    Limit("oidc_refresh_s", 600.0, "s", "between scheduled fetches of the issuer's keys",
          "the keys are fetched again", setting=True),
    Limit("oidc_fetch_timeout_s", 10.0, "s",
          "one request to the issuer (discovery document, JWKS)",
          "the keys in hand stay; tried again after `oidc_min_interval_s`"),
    # --- MJPEG viewers per address (/mjpeg) ---
    # A quarter of mjpeg_max_viewers: it takes at least four addresses to fill the process.
    Limit("mjpeg_viewers_per_address", 50, "viewers",
          "MJPEG connections at once from one client address", "HTTP 503", setting=True),
    # --- the Archiver Appliance retrieval API (aa/, docs/ARCHIVER.md) ---
    Limit("aa_max_pvs", 500, "PVs",
          "PVs in one `getDataForPVs`, `getDataAtTime` or `getPVStatus` request, asked or "
          "matched by its globs (matching stops past it)", "HTTP 400"),
    # A day of one channel in 1 s bins, with room: a plot asks for about its width in points.
    Limit("aa_max_points", 100_000, "samples",
          "samples in one answer, over all its PVs (an array's elements each count; so does "
          "each bin a filling post-processor repeats), counted before anything is read",
          "HTTP 400 naming the count"),
    Limit("aa_max_range_s", 10 * 366 * 86_400.0, "s", "between `from` and `to`", "HTTP 400"),
    Limit("aa_points_per_s", 1_000_000.0, "samples/s",
          "samples answered per identity per second (bursts of twice it); each known id a "
          "`getMatchingPVs` or `getPVStatus` pattern is matched against counts as one, "
          "charged before it is matched", "HTTP 429",
          setting=True),
    Limit("aa_max_pattern", 1_024, "characters",
          "one `getMatchingPVs` or `getPVStatus` regex or glob (matched by RE2, in linear time)",
          "HTTP 400"),
    # aa_max_pvs names of max_id_length characters each.
    Limit("aa_max_names_bytes", 512 * 1024, "bytes",
          "the PV names and globs one request asks for: its body (on `Content-Length` before "
          "reading it, then as read) and its `pv` parameters, checked before any of them is "
          "parsed or matched", "HTTP 413 (a body), 400 (parameters)"),
    # What the reader of an archiver's `getData.raw` accepts (aa/pb.py `PbReader`).
    Limit("aa_pb_line_bytes", _MIB, "bytes", "one line of an archiver's PB answer",
          "the answer is refused as malformed"),
    Limit("aa_pb_samples", 1_000_000, "samples", "samples in one archiver's PB answer",
          "the answer is refused as malformed"),
    Limit("aa_pb_bytes", 64 * _MIB, "bytes", "one archiver's PB answer",
          "the answer is refused as malformed"),
    Limit("aa_pb_fields", 256, "fields",
          "headers of one `PayloadInfo`, field values of one sample, in an archiver's answer",
          "the answer is refused as malformed"),
    # --- time, and what the process holds (api/http_protocol.py, api/connections.py) ---
    Limit("http_header_timeout_s", 5.0, "s",
          "an HTTP request's line and headers (a WebSocket's upgrade request too), from the "
          "connection's opening or the request's first byte", "HTTP 408, connection closed"),
    Limit("tls_handshake_timeout_s", 5.0, "s",
          "a TLS handshake (`--tls-cert`), from the connection's accept; the connection is "
          "counted, and `http_header_timeout_s` runs, from its end", "the connection is closed"),
    Limit("http_body_timeout_s", 10.0, "s",
          "an HTTP request body, from the end of its headers, and one second more for each "
          "`http_body_min_rate` bytes of it received", "HTTP 408, connection closed"),
    Limit("http_body_min_rate", 8_192, "bytes/s",
          "the rate a request body comes at, at least, past its first `http_body_timeout_s`",
          "HTTP 408, connection closed"),
    Limit("http_write_timeout_s", 10.0, "s",
          "an HTTP response the client does not read: its bytes waiting in the server making no "
          "progress (a GraphQL, `/metrics` or `/retrieval/` answer, an MJPEG stream)",
          "the connection is dropped, and what it held freed"),
    Limit("http_answered_linger_s", 2.0, "s",
          "a connection the server answered and is closing (refused, or too slow), still read "
          "so that what the client sent meanwhile does not reset the answer away",
          "closed"),
    Limit("stream_first_message_s", 10.0, "s",
          "a `/stream` connection's first message (its first `ATTACH`), from `HELLO`",
          "close 4000 HEARTBEAT_TIMEOUT"),
    # Room for the 10,000 clients of one process that bench/ measures, and more.
    Limit("max_connections", 16_384, "connections",
          "open connections of one process, HTTP and WebSocket, counted at accept; at most "
          "the process's descriptor limit less `reserved_descriptors`",
          "HTTP 503; `/healthz` and `/readyz` still answered for `probe_connections` more",
          setting=True),
    Limit("reserved_descriptors", 1_024, "descriptors",
          "file descriptors `max_connections` leaves to the rest of the process (upstream "
          "circuits, files), at most half of its limit", "fewer connections"),
    Limit("probe_connections", 64, "connections",
          "connections past `max_connections` that may still ask `/healthz` or `/readyz`",
          "HTTP 503 at accept, nothing read"),
    Limit("max_channels_per_address", 20_000, "channels",
          "distinct upstream channels one client address holds, over its connections and "
          "endpoints: `/stream` attachments, `/pvws/pv` PVs, MJPEG feeds, gets of channels "
          "not monitored", "ERROR 4413; pvws `error`; GraphQL TOO_MANY_CHANNELS; HTTP 429",
          setting=True),
    Limit("pvget_per_s", 50.0, "gets/s",
          "`/pvws/pvget` requests per identity (bursts of twice it)", "HTTP 429 RATE_LIMITED"),
    Limit("pvget_in_flight", 16, "gets",
          "`/pvws/pvget` requests of one client address not answered yet",
          "HTTP 429 TOO_MANY_REQUESTS"),
    # --- the facility's archive behind the history (core/archive/, docs/ARCHIVER.md) ---
    Limit("archive_timeout_s", 5.0, "s",
          "one request's reads of its archivers (a GraphQL request, an Archiver Appliance API "
          "request, one attachment's backfill): connecting, waiting and every byte",
          "the archive part is missing, with the reason; the recent part is answered",
          setting=True),
    Limit("archive_request_bytes", 32 * _MIB, "bytes",
          "archivers' answers read for one request, over all its channels",
          "the archive part is missing, with the reason"),
    Limit("archive_samples", 100_000, "samples",
          "samples (or bins) of one archiver's answer; fewer when the request asked for fewer",
          "the archive part is missing, with the reason"),
    Limit("archive_fetches_per_archiver", 8, "reads",
          "reads of one archiver at once, over every client", "later ones wait, within "
          "`archive_timeout_s`"),
    Limit("archive_fetches_per_identity", 2, "reads",
          "archive reads at once for one identity (user, else address)",
          "later ones wait, within `archive_timeout_s`"),
    Limit("archive_cache_mb", 64.0, "MiB", "archivers' answers kept for repeated reads",
          "the least recently used are dropped", setting=True),
    Limit("archive_recent_cache_s", 10.0, "s",
          "an archiver's answer cached when its range ends within a minute of the read",
          "read again (the archive may still be receiving those samples)"),
    Limit("archive_retry_s", 10.0, "s",
          "an archiver left alone after it failed (down, too slow, malformed)",
          "asked again; meanwhile its parts are missing at once, with the reason"),
    Limit("archive_backfill_rows", 1_000, "rows",
          "rows of one channel's archive part in a backfill (bins wide enough to fit)",
          "wider bins"),
)  # fmt: skip

_BY_NAME = {limit.name: limit for limit in LIMITS}


def default(name: str) -> int | float:
    """The table's value for `name` (for a setting, its default)."""
    return _BY_NAME[name].value


def integer(name: str) -> int:
    """An integer limit's value."""
    value = _BY_NAME[name].value
    assert isinstance(value, int)
    return value


def number(name: str) -> float:
    """A limit's value as a float."""
    return float(_BY_NAME[name].value)


MAX_TOKEN_BYTES = integer("max_token_bytes")
MAX_TOKEN_PAYLOAD_BYTES = integer("max_token_payload_bytes")
ALL_MODE_PER_CHANNEL = integer("all_mode_per_channel")
ALL_MODE_PER_VIEW = integer("all_mode_per_view")
MAX_ID_LENGTH = integer("max_id_length")
MAX_RATE_HZ = number("max_rate_hz")
MAX_COLUMNS = integer("max_columns")
MIN_PIXELS = integer("min_pixels")
MAX_QUERY_TOKENS = integer("max_query_tokens")
MAX_PUT_TIMEOUT_S = number("max_put_timeout_s")
MAX_SEARCH_RESULTS = integer("max_search_results")
SIM_MAX_STORES = integer("sim_max_stores")
MAX_BACKFILL_S = number("max_backfill_s")
HISTORY_ARRAY_BYTES = integer("history_array_bytes")
HISTORY_ARRAY_LIMIT = integer("history_array_limit")
SIM_MAX_COMPUTED_PER_S = number("sim_max_computed_per_s")
PVA_IDENTITY_CONNECTIONS = integer("pva_identity_connections")
PVA_IDENTITY_IDLE_S = number("pva_identity_idle_s")
PVA_IDENTITY_CHANNELS = integer("pva_identity_channels")
PVA_IDENTITY_MESSAGE_BYTES = integer("pva_identity_message_bytes")
PVA_IDENTITY_ADDRESSES = integer("pva_identity_addresses")
HISTORY_MESSAGE_ROWS = integer("history_message_rows")
BACKFILL_PASSES = integer("backfill_passes")


def shown(name: str) -> str:
    """A limit's value as people read it: `1,048,576 bytes`, `24 h`, `1,000 Hz`."""
    limit = _BY_NAME[name]
    v = limit.value
    if limit.unit == "s" and v >= 3600 and v % 3600 == 0:
        return f"{v / 3600:g} h"
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return f"{v:,} {limit.unit}".rstrip()


def markdown() -> str:
    """PROTOCOL.md's table of limits (between its `limits` markers)."""
    rows = [
        "| limit | value | what it bounds | beyond it |",
        "|---|---:|---|---|",
    ]
    for limit in LIMITS:
        name = f"`{limit.name}`" + (" (setting)" if limit.setting else "")
        rows.append(f"| {name} | {shown(limit.name)} | {limit.what} | {limit.over} |")
    return "\n".join(rows) + "\n"

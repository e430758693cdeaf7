"""Thin endpoints, each a router or mount that takes what it uses as arguments (app.py assembles
them): GraphQL (`graphql_http`), the stream WebSocket, MJPEG, probes, metrics and the page
(`routes`); they call into `core`."""

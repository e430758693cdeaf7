"""Thin endpoints: GraphQL, the stream WebSocket, metrics; they call into `core`."""

/** @pvwire/client: stream EPICS process variables from a pvwire server (browsers and Node 20). */
export { PvwireClient } from "./client.js";
export type { ClientOptions, ClientStats, Listener, SubscribeOptions, Subscription, WebSocketConstructor, WebSocketLike } from "./client.js";
export { applyEntry, CONNECTION_STATES, initialState, isWritable, SEVERITIES, toDate, withAccess } from "./channel.js";
export type { Access, AlarmState, ChangedField, ChannelConnection, ChannelState, Severity, Timestamp } from "./channel.js";
export { CLOSE_CODES, CloseCode, closeClass, closeName } from "./closeCodes.js";
export type { CloseClass } from "./closeCodes.js";
export { backoffDelay, DEFAULT_BACKOFF, transition, TRANSITIONS } from "./connection.js";
export type { BackoffOptions, ConnectionEvent, ConnectionState } from "./connection.js";
export { ProtocolError, PvwireError, RequestError, StreamClosedError, StreamRequestError } from "./errors.js";
export type { Channel, PutResult, StreamRegistration, GqlLimits, GqlMetadata } from "./graphql.js";
export { decode, encode, Ext, MsgpackError } from "./msgpack.js";
export type { Encodable, ExtDecoder } from "./msgpack.js";
export { decodeNdArray, encodeNdArray, NdArray, DTYPES } from "./ndarray.js";
export type { ArrayValue, DType, TypedArray } from "./ndarray.js";
export { decodeEntry, decodeServerMessage, encodeClientMessage, Kind, Mask, PROTOCOL_VERSION, SUBPROTOCOL, ALIGNED_SUBPROTOCOL } from "./protocol.js";
export type { ClientMessage, Entry, Group, History, Limits, Metadata, Reduced, ServerMessage, Value } from "./protocol.js";
export { COLOR_MAPS, colorMapTable, DEFAULT_MAX_PIXELS, drawStaleMarker, ImageView, imageGeometry, minMax, renderFrame, STALE_COLOR } from "./imageView.js";
export type { ColorMapName, DisplayRange, ImageStats, ImageViewOptions } from "./imageView.js";

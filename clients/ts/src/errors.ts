/** Errors of the pvwire client: one base class, each subclass carries a code the server defined. */

export class PvwireError extends Error {
  override name = "PvwireError";
  constructor(
    message: string,
    /** Close code (number), GraphQL `extensions.code` (string), or undefined. */
    readonly code?: number | string,
  ) {
    super(message);
  }
}

/** The server sent something the protocol does not allow (our peer's fault). */
export class ProtocolError extends PvwireError {
  override name = "ProtocolError";
}

/** A GraphQL request failed: transport, HTTP status, or an error in the response. */
export class RequestError extends PvwireError {
  override name = "RequestError";
}

/** The stream was closed with a terminal close code (e.g. 4401 BAD_TOKEN); no reconnect. */
export class StreamClosedError extends PvwireError {
  override name = "StreamClosedError";
  constructor(
    message: string,
    override readonly code: number,
    readonly reason: string,
  ) {
    super(message, code);
  }
}

/** The server answered a stream request with ERROR (4400, 4404, 4413). */
export class StreamRequestError extends PvwireError {
  override name = "StreamRequestError";
}

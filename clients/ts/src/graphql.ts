/** The control plane: GraphQL over HTTP POST at `${url}/graphql` (protocol/schema.graphql). */
import { RequestError } from "./errors.js";

export type FetchLike = (input: string, init: { method: string; headers: Record<string, string>; body: string }) => Promise<{
  ok: boolean; status: number; json(): Promise<unknown>;
}>;

export interface GraphQLErrorEntry { message: string; extensions?: { code?: string } }

export async function graphqlRequest<T>(fetchFn: FetchLike, endpoint: string, query: string, variables: Record<string, unknown>, token?: string): Promise<T> {
  let res;
  const auth: Record<string, string> = token ? { authorization: `Bearer ${token}` } : {};
  try {
    res = await fetchFn(endpoint, {
      method: "POST",
      headers: { "content-type": "application/json", accept: "application/json", ...auth },
      body: JSON.stringify({ query, variables }),
    });
  } catch (err) {
    throw new RequestError(`GraphQL request to ${endpoint} failed: ${(err as Error).message}`, "NETWORK");
  }
  let body: unknown;
  try {
    body = await res.json();
  } catch {
    throw new RequestError(`GraphQL request to ${endpoint}: HTTP ${res.status}, body is not JSON`, httpCode(res.status));
  }
  if (typeof body !== "object" || body === null) throw new RequestError(`GraphQL response is not an object (HTTP ${res.status})`, "HTTP");
  const { data, errors } = body as { data?: T | null; errors?: GraphQLErrorEntry[] };
  if (Array.isArray(errors) && errors.length > 0) {
    const first = errors[0]!;
    throw new RequestError(first.message, first.extensions?.code ?? "GRAPHQL");
  }
  if (!res.ok || data === undefined || data === null) throw new RequestError(`GraphQL request failed: HTTP ${res.status}`, httpCode(res.status));
  return data;
}

/** A 401 without a GraphQL body (e.g. from an authenticating proxy) still means "log in again". */
function httpCode(status: number): string {
  return status === 401 ? "UNAUTHENTICATED" : "HTTP";
}

const LIMITS = "{ low high }";
export const METADATA_FIELDS = `{ type count description units precision form display ${LIMITS} control ${LIMITS} alarm ${LIMITS} warning ${LIMITS} choices colorMode writable }`;
export const CHANNEL_FIELDS = `{ id value display time { seconds nanoseconds iso } alarm { severity status message } connection metadata ${METADATA_FIELDS} error errorCode }`;

/** GraphQL `Limits`: sides are null when not set. */
export interface GqlLimits { low: number | null; high: number | null }

export interface GqlMetadata {
  type: string | null; count: number | null; description: string | null; units: string | null;
  precision: number | null; form: string | null; display: GqlLimits | null; control: GqlLimits | null;
  alarm: GqlLimits | null; warning: GqlLimits | null; choices: string[] | null;
  /** Images: how the array's dims hold colour (`mono`, `RGB1`, `RGB2`, `RGB3`...), PROTOCOL.md section 4.5. */
  colorMode: string | null; writable: boolean;
}

/** A channel read through GraphQL (`get`). Arrays arrive as JSON lists. */
export interface Channel {
  id: string;
  value: unknown;
  /** Formatted by the server: precision and units applied, enum as its label. */
  display: string | null;
  time: { seconds: number; nanoseconds: number; iso: string } | null;
  alarm: { severity: "NO_ALARM" | "MINOR" | "MAJOR" | "INVALID"; status: string; message: string } | null;
  connection: "CONNECTING" | "CONNECTED" | "DISCONNECTED" | "FAILED" | "NOT_FOUND";
  metadata: GqlMetadata;
  error: string | null;
  errorCode: string | null;
}

export interface PutResult { id: string; ok: boolean; error: string | null; errorCode: string | null }

export interface StreamRegistration {
  token: string;
  expiresAt: number;
  streamPath: string;
  /** `access`: what this identity may do on the channel (READ or WRITE). */
  channels: { sid: number; id: string; access?: "READ" | "WRITE" }[];
}

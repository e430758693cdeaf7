/**
 * The ndarray MessagePack ext (type 1, PROTOCOL.md section 4.1):
 * `dtype:u8 ndim:u8 dims:ndim×u32le data:raw little-endian elements`.
 *
 * The data becomes a TypedArray over the received bytes when its offset is a multiple of the
 * element size: always for a pvwire server's messages, whose padding starts every array's data
 * on a multiple of 8 from the message's start (PROTOCOL.md section 3). Data that is not aligned
 * (another server, the smaller arrays of a structure) is copied once, in bulk
 * (`Uint8Array.slice`), never per element.
 */
import { ProtocolError } from "./errors.js";

export const NDARRAY_EXT = 1;

export const DTYPES = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float32", "float64"] as const;
export type DType = (typeof DTYPES)[number];

export type TypedArray =
  | Int8Array | Uint8Array | Int16Array | Uint16Array | Int32Array | Uint32Array
  | BigInt64Array | BigUint64Array | Float32Array | Float64Array;

type TypedArrayCtor = {
  new (buffer: ArrayBufferLike, byteOffset: number, length: number): TypedArray;
  new (buffer: ArrayBufferLike): TypedArray;
  readonly BYTES_PER_ELEMENT: number;
};

const CTORS: readonly TypedArrayCtor[] = [
  Int8Array, Uint8Array, Int16Array, Uint16Array, Int32Array, Uint32Array,
  BigInt64Array, BigUint64Array, Float32Array, Float64Array,
] as unknown as TypedArrayCtor[];

/** An array of more than one dimension (e.g. an image, dims = [height, width]), C order. */
export class NdArray {
  constructor(
    readonly dtype: DType,
    readonly dims: readonly number[],
    readonly data: TypedArray,
  ) {}
}

/** Waveforms (ndim 1) decode to a plain TypedArray; every other shape to an NdArray. */
export type ArrayValue = TypedArray | NdArray;

const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

export function decodeNdArray(ext: Uint8Array): ArrayValue {
  if (!LITTLE_ENDIAN) throw new ProtocolError("ndarray: big-endian hosts are not supported");
  if (ext.length < 2) throw new ProtocolError(`ndarray: ext of ${ext.length} bytes has no header`);
  const code = ext[0]!;
  const ndim = ext[1]!;
  const Ctor = CTORS[code];
  const dtype = DTYPES[code];
  if (Ctor === undefined || dtype === undefined) throw new ProtocolError(`ndarray: unknown dtype code ${code}`);
  const start = 2 + 4 * ndim;
  if (ext.length < start) throw new ProtocolError(`ndarray: ${ndim} dims need ${start} header bytes, ext has ${ext.length}`);
  const view = new DataView(ext.buffer, ext.byteOffset, ext.byteLength);
  const dims: number[] = [];
  let count = 1;
  for (let i = 0; i < ndim; i++) {
    const d = view.getUint32(2 + 4 * i, true);
    dims.push(d);
    count *= d;
  }
  const size = Ctor.BYTES_PER_ELEMENT;
  if (ext.length - start !== count * size) {
    throw new ProtocolError(`ndarray: dims [${dims.join(", ")}] of ${dtype} need ${count * size} data bytes, got ${ext.length - start}`);
  }
  const offset = ext.byteOffset + start;
  const data = offset % size === 0
    ? new Ctor(ext.buffer, offset, count)
    : new Ctor(ext.slice(start).buffer); // one bulk copy to an aligned buffer
  return ndim === 1 ? data : new NdArray(dtype, dims, data);
}

/** Encode a TypedArray or NdArray as the ext payload (tests, and symmetric with the server). */
export function encodeNdArray(value: ArrayValue): Uint8Array {
  const data = value instanceof NdArray ? value.data : value;
  const dims = value instanceof NdArray ? value.dims : [data.length];
  const code = CTORS.findIndex((c) => data instanceof (c as unknown as new () => TypedArray));
  const out = new Uint8Array(2 + 4 * dims.length + data.byteLength);
  out[0] = code;
  out[1] = dims.length;
  const view = new DataView(out.buffer);
  dims.forEach((d, i) => view.setUint32(2 + 4 * i, d, true));
  out.set(new Uint8Array(data.buffer, data.byteOffset, data.byteLength), 2 + 4 * dims.length);
  return out;
}

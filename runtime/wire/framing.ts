// Length-prefixed frames for the Node ⇄ Python pipe (runtime/PROTOCOL.md, "Framing"):
//   u32 BE header_len | u32 BE body_len | JSON header | raw body (tensors, little-endian).
// The decoder is incremental and copies each frame at most once; the encoder never copies a
// tensor's bytes (it hands the caller's Buffers to the stream as separate writes).

import { DTYPE_ITEMSIZE, TENSOR_DTYPES, type TensorDtype } from "../../lib/dtypes.js";
import type { TensorData } from "../types.js";

export const PREFIX_BYTES = 8;
export const MAX_HEADER_BYTES = 16 * 1024 * 1024;
export const DEFAULT_MAX_BODY_BYTES = 1024 * 1024 * 1024;
/** Tensor offsets in bodies we write are aligned so the worker can view them without copying. */
export const TENSOR_ALIGN = 8;

export interface TensorDescriptor {
  dtype: TensorDtype;
  shape: number[];
  offset: number;
  nbytes: number;
}

export interface Frame {
  header: Record<string, unknown>;
  /** The whole body; `tensors[i].data` are views into it (no copies). */
  body: Buffer;
  tensors: TensorData[];
}

/**
 * A frame that could not be decoded. `fatal` means the byte stream can no longer be trusted
 * (a length prefix is out of range and cannot be skipped): the peer must be restarted.
 */
export class FrameError extends Error {
  readonly code = "protocol_error";
  readonly id: string | null;
  readonly fatal: boolean;
  constructor(message: string, opts: { id?: string | null; fatal?: boolean } = {}) {
    super(message);
    this.name = "FrameError";
    this.id = opts.id ?? null;
    this.fatal = opts.fatal ?? false;
  }
}

export type DecodeEvent = { kind: "frame"; frame: Frame } | { kind: "error"; error: FrameError };

function isTensorDtype(x: unknown): x is TensorDtype {
  return typeof x === "string" && (TENSOR_DTYPES as readonly string[]).includes(x);
}

/** Number of elements, or an Error describing why the shape is not acceptable. */
export function shapeNumel(shape: unknown): number | Error {
  if (!Array.isArray(shape)) return new Error("shape must be an array of non-negative integers");
  let n = 1;
  for (const d of shape) {
    if (typeof d !== "number" || !Number.isSafeInteger(d) || d < 0) {
      return new Error(`shape ${JSON.stringify(shape)} must contain non-negative integers`);
    }
    n *= d;
    if (!Number.isSafeInteger(n)) return new Error(`shape ${JSON.stringify(shape)} is too large`);
  }
  return n;
}

export function tensorNbytes(dtype: TensorDtype, shape: number[]): number {
  const n = shapeNumel(shape);
  if (n instanceof Error) throw n;
  return n * DTYPE_ITEMSIZE[dtype];
}

/** Checks `header.tensors` against the body and returns views of the body (no copies). */
export function validateTensorDescriptors(raw: unknown, bodyLen: number): TensorDescriptor[] {
  if (raw === undefined || raw === null) return [];
  if (!Array.isArray(raw)) throw new Error("header.tensors must be a list");
  return raw.map((t: unknown, i): TensorDescriptor => {
    if (typeof t !== "object" || t === null) throw new Error(`tensors[${i}] must be an object`);
    const { dtype, shape, offset, nbytes } = t as Record<string, unknown>;
    if (!isTensorDtype(dtype)) {
      throw new Error(
        `tensors[${i}].dtype ${JSON.stringify(dtype)} is not one of ${TENSOR_DTYPES.join(", ")}`,
      );
    }
    const numel = shapeNumel(shape);
    if (numel instanceof Error) throw new Error(`tensors[${i}]: ${numel.message}`);
    for (const [name, v] of [
      ["offset", offset],
      ["nbytes", nbytes],
    ] as const) {
      if (typeof v !== "number" || !Number.isSafeInteger(v) || v < 0) {
        throw new Error(`tensors[${i}].${name} must be a non-negative integer`);
      }
    }
    const want = numel * DTYPE_ITEMSIZE[dtype];
    if (nbytes !== want) {
      throw new Error(
        `tensors[${i}].nbytes is ${nbytes} but ${dtype}${JSON.stringify(shape)} needs ${want}`,
      );
    }
    if ((offset as number) + (nbytes as number) > bodyLen) {
      throw new Error(
        `tensors[${i}] (offset ${offset}, ${nbytes} bytes) lies outside the ${bodyLen}-byte body`,
      );
    }
    return { dtype, shape: shape as number[], offset: offset as number, nbytes: nbytes as number };
  });
}

/**
 * Encodes one frame as a list of Buffers to write in order: prefix + header, then the tensors'
 * own Buffers (not copied) with small zero pads for alignment. The caller must not mutate the
 * tensor Buffers until the writes have been flushed.
 */
export function encodeFrame(
  header: Record<string, unknown>,
  tensors: readonly TensorData[] = [],
  maxBodyBytes: number = DEFAULT_MAX_BODY_BYTES,
): Buffer[] {
  const descriptors: TensorDescriptor[] = [];
  const bodyParts: Buffer[] = [];
  let offset = 0;
  tensors.forEach((t, i) => {
    if (!isTensorDtype(t.dtype))
      throw new RangeError(`tensor ${i}: unknown dtype ${String(t.dtype)}`);
    const nbytes = tensorNbytes(t.dtype, t.shape);
    if (!Buffer.isBuffer(t.data) || t.data.length !== nbytes) {
      throw new RangeError(
        `tensor ${i}: ${t.dtype}${JSON.stringify(t.shape)} needs ${nbytes} bytes of data, got ${t.data?.length ?? "none"}`,
      );
    }
    const pad = (TENSOR_ALIGN - (offset % TENSOR_ALIGN)) % TENSOR_ALIGN;
    if (pad) {
      bodyParts.push(Buffer.alloc(pad));
      offset += pad;
    }
    descriptors.push({ dtype: t.dtype, shape: [...t.shape], offset, nbytes });
    if (nbytes > 0) bodyParts.push(t.data);
    offset += nbytes;
  });
  if (offset > maxBodyBytes) {
    throw new RangeError(`frame body of ${offset} bytes exceeds the ${maxBodyBytes}-byte limit`);
  }
  const json = Buffer.from(
    JSON.stringify(descriptors.length ? { ...header, tensors: descriptors } : header),
    "utf8",
  );
  if (json.length < 1 || json.length > MAX_HEADER_BYTES) {
    throw new RangeError(`frame header of ${json.length} bytes is outside 1..${MAX_HEADER_BYTES}`);
  }
  const head = Buffer.allocUnsafe(PREFIX_BYTES + json.length);
  head.writeUInt32BE(json.length, 0);
  head.writeUInt32BE(offset, 4);
  json.copy(head, PREFIX_BYTES);
  return [head, ...bodyParts];
}

/** Convenience for tests and small frames: one contiguous Buffer (copies the tensors). */
export function encodeFrameToBuffer(
  header: Record<string, unknown>,
  tensors: readonly TensorData[] = [],
): Buffer {
  return Buffer.concat(encodeFrame(header, tensors));
}

export interface FrameDecoderOptions {
  maxBodyBytes?: number;
  maxHeaderBytes?: number;
}

/**
 * Incremental decoder. `push` accepts chunks of any size and returns the frames (and non-fatal
 * errors) completed by it. Chunks are kept in a list and joined once per frame, so a 1 GiB body
 * arriving in 64 KiB chunks costs one copy, not one per chunk.
 */
export class FrameDecoder {
  private readonly maxBody: number;
  private readonly maxHeader: number;
  private chunks: Buffer[] = [];
  /** Bytes of chunks[0] already consumed. */
  private headOffset = 0;
  private buffered = 0;
  /** Bytes still to discard from a frame whose header was too large to read. */
  private skipping = 0;
  private pending: { headerLen: number; bodyLen: number } | null = null;
  private dead: FrameError | null = null;

  constructor(opts: FrameDecoderOptions = {}) {
    this.maxBody = opts.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES;
    this.maxHeader = Math.min(opts.maxHeaderBytes ?? MAX_HEADER_BYTES, MAX_HEADER_BYTES);
  }

  /** The fatal error that stopped this decoder, if any. */
  get failed(): FrameError | null {
    return this.dead;
  }

  /** Bytes held while waiting for the rest of a frame. */
  get bufferedBytes(): number {
    return this.buffered;
  }

  push(chunk: Buffer): DecodeEvent[] {
    if (this.dead || chunk.length === 0) return [];
    this.chunks.push(chunk);
    this.buffered += chunk.length;
    const out: DecodeEvent[] = [];
    for (;;) {
      if (this.skipping > 0) {
        const n = Math.min(this.skipping, this.buffered);
        this.discard(n);
        this.skipping -= n;
        if (this.skipping > 0) return out;
      }
      if (!this.pending) {
        if (this.buffered < PREFIX_BYTES) return out;
        const prefix = this.take(PREFIX_BYTES);
        const headerLen = prefix.readUInt32BE(0);
        const bodyLen = prefix.readUInt32BE(4);
        if (bodyLen > this.maxBody) {
          // A body this large is either an attack or a desynchronised stream: skipping it
          // could mean waiting for gigabytes that never come, so the stream is abandoned.
          this.dead = new FrameError(
            `frame body of ${bodyLen} bytes exceeds the ${this.maxBody}-byte limit`,
            { fatal: true },
          );
          this.chunks = [];
          this.buffered = 0;
          out.push({ kind: "error", error: this.dead });
          return out;
        }
        if (headerLen < 1 || headerLen > this.maxHeader) {
          this.skipping = headerLen + bodyLen;
          out.push({
            kind: "error",
            error: new FrameError(
              `frame header of ${headerLen} bytes is outside 1..${this.maxHeader}; frame skipped`,
            ),
          });
          continue;
        }
        this.pending = { headerLen, bodyLen };
      }
      const { headerLen, bodyLen } = this.pending;
      if (this.buffered < headerLen + bodyLen) return out;
      this.pending = null;
      const headerBytes = this.take(headerLen);
      const body = bodyLen ? this.take(bodyLen) : Buffer.alloc(0);
      out.push(decodeParts(headerBytes, body));
    }
  }

  /** Removes and returns the next n bytes; a view when they lie in one chunk, else one copy. */
  private take(n: number): Buffer {
    const first = this.chunks[0];
    if (first.length - this.headOffset >= n) {
      const out = first.subarray(this.headOffset, this.headOffset + n);
      this.advance(n);
      return out;
    }
    const out = Buffer.allocUnsafe(n);
    let filled = 0;
    while (filled < n) {
      const c = this.chunks[0];
      const m = Math.min(c.length - this.headOffset, n - filled);
      c.copy(out, filled, this.headOffset, this.headOffset + m);
      filled += m;
      this.advance(m);
    }
    return out;
  }

  private discard(n: number): void {
    while (n > 0) {
      const m = Math.min(this.chunks[0].length - this.headOffset, n);
      this.advance(m);
      n -= m;
    }
  }

  private advance(n: number): void {
    this.headOffset += n;
    this.buffered -= n;
    if (this.headOffset === this.chunks[0].length) {
      this.chunks.shift();
      this.headOffset = 0;
    }
  }
}

function decodeParts(headerBytes: Buffer, body: Buffer): DecodeEvent {
  let header: unknown;
  try {
    header = JSON.parse(headerBytes.toString("utf8"));
  } catch {
    return { kind: "error", error: new FrameError("frame header is not valid UTF-8 JSON") };
  }
  if (typeof header !== "object" || header === null || Array.isArray(header)) {
    return { kind: "error", error: new FrameError("frame header must be a JSON object") };
  }
  const h = header as Record<string, unknown>;
  const id = typeof h.id === "string" ? h.id : null;
  let descriptors: TensorDescriptor[];
  try {
    descriptors = validateTensorDescriptors(h.tensors, body.length);
  } catch (e) {
    return { kind: "error", error: new FrameError((e as Error).message, { id }) };
  }
  const tensors = descriptors.map((d) => ({
    dtype: d.dtype,
    shape: d.shape,
    data: body.subarray(d.offset, d.offset + d.nbytes),
  }));
  return { kind: "frame", frame: { header: h, body, tensors } };
}

/** Decodes exactly one complete frame held in `buf` (tests, tools). */
export function decodeFrame(buf: Buffer, opts: FrameDecoderOptions = {}): Frame {
  const d = new FrameDecoder(opts);
  const events = d.push(buf);
  if (events.length !== 1 || d.bufferedBytes !== 0) {
    throw new FrameError(`expected exactly one complete frame, got ${events.length} event(s)`);
  }
  const e = events[0];
  if (e.kind === "error") throw e.error;
  return e.frame;
}

type NumericArray =
  Float32Array | Float64Array | Int32Array | Int16Array | Int8Array | Uint8Array | BigInt64Array;

/**
 * A typed-array view of a float32/float64/int tensor. Views need the byte offset to be a
 * multiple of the item size; when it is not (a frame sliced out of a larger chunk), the bytes
 * are copied once. float16/bfloat16 have no JS typed array and are rejected.
 */
export function tensorView(t: TensorData): NumericArray {
  const ctors = {
    float32: Float32Array,
    float64: Float64Array,
    int64: BigInt64Array,
    int32: Int32Array,
    int16: Int16Array,
    int8: Int8Array,
    uint8: Uint8Array,
    bool: Uint8Array,
  } as const;
  if (!(t.dtype in ctors)) throw new RangeError(`no typed array for dtype ${t.dtype}`);
  const Ctor = ctors[t.dtype as keyof typeof ctors];
  let data = t.data;
  if (data.byteOffset % Ctor.BYTES_PER_ELEMENT !== 0) data = Buffer.from(data);
  return new Ctor(
    data.buffer as ArrayBuffer,
    data.byteOffset,
    data.length / Ctor.BYTES_PER_ELEMENT,
  );
}

/** Builds a tensor from a typed array without copying its bytes. */
export function tensorFrom(
  dtype: TensorDtype,
  shape: number[],
  values: ArrayBufferView,
): TensorData {
  return {
    dtype,
    shape,
    data: Buffer.from(values.buffer, values.byteOffset, values.byteLength),
  };
}

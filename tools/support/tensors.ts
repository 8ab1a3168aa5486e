// Conversions between the MCP surface (number arrays or base64 bytes) and raw tensors for the pipe.
import { DTYPE_ITEMSIZE } from "../../lib/dtypes.js";
import type { TensorData, TensorDtype } from "../../runtime/types.js";
import { ToolError } from "../errors.js";

export function elementCount(shape: readonly number[]): number {
  return shape.reduce((n, d) => n * d, 1);
}

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

function toBf16(x: number): number {
  f32[0] = x;
  const bits = u32[0];
  if ((bits & 0x7f800000) === 0x7f800000 && bits & 0x7fffff) return 0x7fc0; // NaN
  // Round to nearest even on the 16 dropped bits.
  return ((bits + 0x7fff + ((bits >>> 16) & 1)) >>> 16) & 0xffff;
}

function fromBf16(h: number): number {
  u32[0] = h << 16;
  return f32[0];
}

function toF16(x: number): number {
  f32[0] = x;
  const b = u32[0];
  const sign = (b >>> 16) & 0x8000;
  const exp = (b >>> 23) & 0xff;
  let mant = b & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0);
  const e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;
    mant = (mant | 0x800000) >> (1 - e);
    return sign | ((mant + 0x1000) >> 13);
  }
  const h = sign | (e << 10) | (mant >> 13);
  return mant & 0x1000 ? h + 1 : h; // round half up on the first dropped bit
}

function fromF16(h: number): number {
  const s = h & 0x8000 ? -1 : 1;
  const e = (h >> 10) & 0x1f;
  const m = h & 0x3ff;
  if (e === 0) return s * m * 2 ** -24;
  if (e === 0x1f) return m ? NaN : s * Infinity;
  return s * (1 + m / 1024) * 2 ** (e - 15);
}

/** Encodes a number array as raw little-endian bytes of `dtype`. */
export function encodeValues(dtype: TensorDtype, values: readonly number[]): Buffer {
  const n = values.length;
  const buf = Buffer.allocUnsafe(n * DTYPE_ITEMSIZE[dtype]);
  for (let i = 0; i < n; i++) {
    const v = values[i];
    switch (dtype) {
      case "float32":
        buf.writeFloatLE(v, i * 4);
        break;
      case "float64":
        buf.writeDoubleLE(v, i * 8);
        break;
      case "float16":
        buf.writeUInt16LE(toF16(v), i * 2);
        break;
      case "bfloat16":
        buf.writeUInt16LE(toBf16(v), i * 2);
        break;
      default: {
        if (!Number.isInteger(v)) {
          throw new ToolError(
            "invalid_argument",
            `tensors: ${dtype} data must be integers (got ${v})`,
          );
        }
        if (dtype === "int64") buf.writeBigInt64LE(BigInt(v), i * 8);
        else if (dtype === "int32") buf.writeInt32LE(v, i * 4);
        else if (dtype === "int16") buf.writeInt16LE(v, i * 2);
        else if (dtype === "int8") buf.writeInt8(v, i);
        else if (dtype === "uint8") buf.writeUInt8(v, i);
        else buf.writeUInt8(v ? 1 : 0, i);
      }
    }
  }
  return buf;
}

/** Back to the nearest value of a float dtype, as the tensor holds it. */
const ROUND_TRIP: Partial<Record<TensorDtype, (x: number) => number>> = {
  float32: Math.fround,
  float16: (x) => fromF16(toF16(x)),
  bfloat16: (x) => fromBf16(toBf16(x)),
};

/**
 * Values for an inline answer: a float is written with the fewest digits that still read back as
 * the same value of its dtype (a float32 needs at most 9, not the 17 of the double it is widened
 * to), so an embedding costs an agent about half the bytes and loses nothing.
 */
export function inlineValues(t: TensorData): number[] {
  const values = decodeValues(t);
  const back = ROUND_TRIP[t.dtype];
  if (!back) return values;
  const from = t.dtype === "float32" ? 6 : 3;
  return values.map((v) => {
    if (!Number.isFinite(v)) return v;
    for (let p = from; p < 17; p++) {
      const short = Number(v.toPrecision(p));
      if (back(short) === v) return short;
    }
    return v;
  });
}

/** Decodes raw bytes to numbers (for small outputs returned inline and for statistics). */
export function decodeValues(t: TensorData, limit = Infinity): number[] {
  const n = Math.min(elementCount(t.shape), limit);
  const b = t.data;
  const out = new Array<number>(n);
  for (let i = 0; i < n; i++) {
    switch (t.dtype) {
      case "float32":
        out[i] = b.readFloatLE(i * 4);
        break;
      case "float64":
        out[i] = b.readDoubleLE(i * 8);
        break;
      case "float16":
        out[i] = fromF16(b.readUInt16LE(i * 2));
        break;
      case "bfloat16":
        out[i] = fromBf16(b.readUInt16LE(i * 2));
        break;
      case "int64":
        out[i] = Number(b.readBigInt64LE(i * 8));
        break;
      case "int32":
        out[i] = b.readInt32LE(i * 4);
        break;
      case "int16":
        out[i] = b.readInt16LE(i * 2);
        break;
      case "int8":
        out[i] = b.readInt8(i);
        break;
      default:
        out[i] = b.readUInt8(i);
    }
  }
  return out;
}

export interface TensorArg {
  dtype: TensorDtype;
  shape: number[];
  data?: number[];
  data_b64?: string;
}

export function tensorFromArg(t: TensorArg, index: number, maxElements: number): TensorData {
  const n = elementCount(t.shape);
  if (n > maxElements) {
    throw new ToolError(
      "invalid_argument",
      `tensors.${index}: ${n} elements is over the limit of ${maxElements}; send a smaller batch`,
    );
  }
  if (t.data) {
    if (t.data.length !== n) {
      throw new ToolError(
        "invalid_argument",
        `tensors.${index}: shape [${t.shape.join(", ")}] needs ${n} values, got ${t.data.length}`,
      );
    }
    if (t.dtype.startsWith("float") || t.dtype === "bfloat16") {
      if (t.data.some((v) => !Number.isFinite(v))) {
        throw new ToolError("invalid_argument", `tensors.${index}: data must be finite numbers`);
      }
    }
    return { dtype: t.dtype, shape: t.shape, data: encodeValues(t.dtype, t.data) };
  }
  const data = Buffer.from(t.data_b64 ?? "", "base64");
  if (data.byteLength !== n * DTYPE_ITEMSIZE[t.dtype]) {
    throw new ToolError(
      "invalid_argument",
      `tensors.${index}: shape [${t.shape.join(", ")}] of ${t.dtype} needs ${n * DTYPE_ITEMSIZE[t.dtype]} bytes, data_b64 decodes to ${data.byteLength}`,
    );
  }
  return { dtype: t.dtype, shape: t.shape, data };
}

export function summarise(t: TensorData) {
  const n = elementCount(t.shape);
  // Statistics over at most 1M values keep a huge output from stalling the event loop.
  const sample = decodeValues(t, 1 << 20);
  let min = Infinity;
  let max = -Infinity;
  let sum = 0;
  let sq = 0;
  for (const v of sample) {
    if (v < min) min = v;
    if (v > max) max = v;
    sum += v;
    sq += v * v;
  }
  const m = sample.length ? sum / sample.length : 0;
  return {
    elements: n,
    min: sample.length ? min : 0,
    max: sample.length ? max : 0,
    mean: m,
    std: sample.length ? Math.sqrt(Math.max(0, sq / sample.length - m * m)) : 0,
    first: sample.slice(0, 16),
    sampled: sample.length < n,
  };
}

import { describe, expect, it } from "vitest";
import {
  FrameDecoder,
  FrameError,
  MAX_HEADER_BYTES,
  TENSOR_ALIGN,
  decodeFrame,
  encodeFrame,
  encodeFrameToBuffer,
  tensorFrom,
  tensorView,
  type DecodeEvent,
} from "../../runtime/wire/framing.js";
import { parseWorkerMessage, requestMessage } from "../../runtime/wire/messages.js";
import type { TensorData } from "../../runtime/types.js";

function rawFrame(
  header: unknown,
  body: Buffer = Buffer.alloc(0),
  headerLen?: number,
  bodyLen?: number,
): Buffer {
  const json = Buffer.from(typeof header === "string" ? header : JSON.stringify(header), "utf8");
  const prefix = Buffer.alloc(8);
  prefix.writeUInt32BE(headerLen ?? json.length, 0);
  prefix.writeUInt32BE(bodyLen ?? body.length, 4);
  return Buffer.concat([prefix, json, body]);
}

function frames(events: DecodeEvent[]) {
  return events.flatMap((e) => (e.kind === "frame" ? [e.frame] : []));
}

function errors(events: DecodeEvent[]) {
  return events.flatMap((e) => (e.kind === "error" ? [e.error] : []));
}

const f32 = (values: number[], shape = [values.length]): TensorData =>
  tensorFrom("float32", shape, new Float32Array(values));

describe("frame encoding", () => {
  it("round-trips a header with several tensors of different dtypes", () => {
    const tensors: TensorData[] = [
      f32([1, 2, 3, 4, 5, 6], [2, 3]),
      tensorFrom("int8", [3], new Int8Array([-1, 0, 1])),
      tensorFrom("int64", [2], new BigInt64Array([1n, -2n])),
      { dtype: "bfloat16", shape: [2], data: Buffer.from([0x80, 0x3f, 0x00, 0x40]) },
      tensorFrom("float32", [0, 4], new Float32Array(0)),
    ];
    const frame = decodeFrame(
      encodeFrameToBuffer(requestMessage("r1", "infer", { model: "m" }), tensors),
    );
    expect(frame.header).toMatchObject({
      type: "request",
      id: "r1",
      op: "infer",
      args: { model: "m" },
    });
    expect(frame.tensors.map((t) => [t.dtype, t.shape])).toEqual(
      tensors.map((t) => [t.dtype, t.shape]),
    );
    expect([...(tensorView(frame.tensors[0]) as Float32Array)]).toEqual([1, 2, 3, 4, 5, 6]);
    expect([...(tensorView(frame.tensors[1]) as Int8Array)]).toEqual([-1, 0, 1]);
    expect([...(tensorView(frame.tensors[2]) as BigInt64Array)]).toEqual([1n, -2n]);
    expect(frame.tensors[3].data.equals(tensors[3].data)).toBe(true);
    expect(frame.tensors[4].data.length).toBe(0);
  });

  it("aligns tensor offsets so the worker can view them without copying", () => {
    const parts = encodeFrame({ type: "request", id: "a" }, [
      tensorFrom("uint8", [3], new Uint8Array([1, 2, 3])),
      f32([1]),
    ]);
    const header = JSON.parse(parts[0].subarray(8).toString());
    expect(header.tensors.map((t: { offset: number }) => t.offset % TENSOR_ALIGN)).toEqual([0, 0]);
  });

  it("hands tensor Buffers to the writer without copying them", () => {
    const big = Buffer.alloc(16 * 1024 * 1024, 7);
    const parts = encodeFrame({ type: "request", id: "big" }, [
      { dtype: "uint8", shape: [big.length], data: big },
    ]);
    expect(parts).toHaveLength(2);
    expect(parts[1]).toBe(big);
  });

  it("refuses tensors whose data does not match dtype × shape", () => {
    expect(() =>
      encodeFrame({ type: "request" }, [{ dtype: "float32", shape: [3], data: Buffer.alloc(8) }]),
    ).toThrow(/needs 12 bytes/);
    expect(() =>
      encodeFrame({ type: "request" }, [{ dtype: "float32", shape: [-1], data: Buffer.alloc(0) }]),
    ).toThrow(/non-negative/);
  });

  it("refuses a body over the limit", () => {
    expect(() => encodeFrame({ type: "request" }, [f32([1, 2, 3])], 8)).toThrow(
      /exceeds the 8-byte limit/,
    );
  });
});

describe("frame decoding", () => {
  it("reassembles frames split at every byte boundary", () => {
    const buf = encodeFrameToBuffer({ type: "result", id: "x", result: { ok: true } }, [
      f32([1.5, -2]),
    ]);
    for (let cut = 1; cut < buf.length; cut++) {
      const d = new FrameDecoder();
      const evs = [...d.push(buf.subarray(0, cut)), ...d.push(buf.subarray(cut))];
      const got = frames(evs);
      expect(got).toHaveLength(1);
      expect([...(tensorView(got[0].tensors[0]) as Float32Array)]).toEqual([1.5, -2]);
      expect(d.bufferedBytes).toBe(0);
    }
  });

  it("decodes a byte-at-a-time stream", () => {
    const buf = encodeFrameToBuffer({ type: "pong", id: "p", time_s: 1 });
    const d = new FrameDecoder();
    const evs: DecodeEvent[] = [];
    for (let i = 0; i < buf.length; i++) evs.push(...d.push(buf.subarray(i, i + 1)));
    expect(frames(evs).map((f) => f.header.id)).toEqual(["p"]);
  });

  it("returns every frame of a chunk holding many frames", () => {
    const bufs = Array.from({ length: 500 }, (_, i) =>
      encodeFrameToBuffer({ type: "result", id: `r${i}`, result: {} }, [f32([i])]),
    );
    const all = Buffer.concat(bufs);
    const d = new FrameDecoder();
    // Uneven chunks that cut through prefixes, headers and bodies.
    const evs: DecodeEvent[] = [];
    for (let i = 0; i < all.length; i += 777) evs.push(...d.push(all.subarray(i, i + 777)));
    const got = frames(evs);
    expect(got.map((f) => f.header.id)).toEqual(bufs.map((_, i) => `r${i}`));
    expect(got.map((f) => (tensorView(f.tensors[0]) as Float32Array)[0])).toEqual(
      bufs.map((_, i) => i),
    );
  });

  it("round-trips a 16 MB tensor delivered in 64 KiB chunks", () => {
    const n = 4 * 1024 * 1024; // 16 MiB of float32
    const values = new Float32Array(n);
    for (let i = 0; i < n; i++) values[i] = i * 0.5;
    const parts = encodeFrame({ type: "result", id: "big", result: {} }, [
      tensorFrom("float32", [1024, 4096], values),
    ]);
    const d = new FrameDecoder();
    const evs: DecodeEvent[] = [];
    for (const part of parts) {
      for (let i = 0; i < part.length; i += 65536) evs.push(...d.push(part.subarray(i, i + 65536)));
    }
    const [frame] = frames(evs);
    expect(frame.tensors[0].shape).toEqual([1024, 4096]);
    const out = tensorView(frame.tensors[0]) as Float32Array;
    expect(out.length).toBe(n);
    expect(out[0]).toBe(0);
    expect(out[12345]).toBe(12345 * 0.5);
    expect(out[n - 1]).toBe((n - 1) * 0.5);
  });

  it("reports bad JSON and keeps decoding the frames after it", () => {
    const d = new FrameDecoder();
    const evs = d.push(
      Buffer.concat([rawFrame("{not json"), rawFrame({ type: "pong", id: "ok", time_s: 0 })]),
    );
    expect(errors(evs).map((e) => e.message)).toEqual(["frame header is not valid UTF-8 JSON"]);
    expect(frames(evs).map((f) => f.header.id)).toEqual(["ok"]);
  });

  it("rejects a header that is not an object", () => {
    expect(() => decodeFrame(rawFrame("[1,2]"))).toThrow(/must be a JSON object/);
  });

  it("skips a frame whose header exceeds the limit and resynchronises", () => {
    const d = new FrameDecoder({ maxHeaderBytes: 48 });
    const big = rawFrame({ type: "result", id: "x".repeat(64), result: {} }, Buffer.alloc(10));
    const evs = [...d.push(big), ...d.push(rawFrame({ type: "pong", id: "after", time_s: 0 }))];
    expect(errors(evs)[0].message).toMatch(/outside 1\.\.48; frame skipped/);
    expect(errors(evs)[0].fatal).toBe(false);
    expect(frames(evs).map((f) => f.header.id)).toEqual(["after"]);
  });

  it("treats a zero-length header as an error", () => {
    const d = new FrameDecoder();
    const evs = d.push(
      Buffer.concat([
        rawFrame("", Buffer.alloc(0), 0, 0),
        rawFrame({ type: "pong", id: "p", time_s: 0 }),
      ]),
    );
    expect(errors(evs)).toHaveLength(1);
    expect(frames(evs)).toHaveLength(1);
  });

  it("never accepts more than the 16 MiB header limit even if configured higher", () => {
    const d = new FrameDecoder({ maxHeaderBytes: MAX_HEADER_BYTES * 4 });
    const prefix = Buffer.alloc(8);
    prefix.writeUInt32BE(MAX_HEADER_BYTES + 1, 0);
    const evs = d.push(prefix);
    expect(errors(evs)[0].message).toMatch(/frame skipped/);
  });

  it("stops for good on a body length over the limit (the stream cannot be trusted)", () => {
    const d = new FrameDecoder({ maxBodyBytes: 1024 });
    const evs = d.push(
      rawFrame({ type: "result", id: "x", result: {} }, Buffer.alloc(0), undefined, 4096),
    );
    expect(errors(evs)).toHaveLength(1);
    expect(errors(evs)[0]).toBeInstanceOf(FrameError);
    expect(errors(evs)[0].fatal).toBe(true);
    expect(d.failed).not.toBeNull();
    expect(d.push(rawFrame({ type: "pong", id: "p", time_s: 0 }))).toEqual([]);
  });

  it.each([
    ["unknown dtype", { dtype: "complex64", shape: [1], offset: 0, nbytes: 8 }, /dtype/],
    [
      "nbytes not matching the shape",
      { dtype: "float32", shape: [2], offset: 0, nbytes: 4 },
      /needs 8/,
    ],
    [
      "tensor beyond the body",
      { dtype: "float32", shape: [4], offset: 8, nbytes: 16 },
      /outside the 16-byte body/,
    ],
    ["negative offset", { dtype: "uint8", shape: [1], offset: -1, nbytes: 1 }, /offset must be/],
    [
      "fractional dimension",
      { dtype: "uint8", shape: [1.5], offset: 0, nbytes: 1 },
      /non-negative integers/,
    ],
    ["shape not a list", { dtype: "uint8", shape: 3, offset: 0, nbytes: 3 }, /shape must be/],
  ])("rejects a bad tensor descriptor: %s, naming the request", (_name, desc, pattern) => {
    const d = new FrameDecoder();
    const evs = d.push(
      Buffer.concat([
        rawFrame({ type: "result", id: "bad", result: {}, tensors: [desc] }, Buffer.alloc(16)),
        rawFrame({ type: "pong", id: "next", time_s: 0 }),
      ]),
    );
    const [err] = errors(evs);
    expect(err.message).toMatch(pattern);
    expect(err.id).toBe("bad");
    expect(err.fatal).toBe(false);
    expect(frames(evs).map((f) => f.header.id)).toEqual(["next"]);
  });

  it("rejects tensors that is not a list", () => {
    expect(() =>
      decodeFrame(rawFrame({ type: "result", id: "x", result: {}, tensors: {} })),
    ).toThrow(/must be a list/);
  });
});

describe("worker message validation", () => {
  it("accepts each worker message type", () => {
    const device = {
      kind: "cpu",
      name: "cpu",
      index: 0,
      count: 1,
      memory_total_bytes: null,
      memory_free_bytes: null,
      backend: "cpu",
      backend_version: null,
    };
    const msgs = [
      {
        type: "hello",
        protocol: 1,
        worker_version: "0.1.0",
        torch_version: "2.13",
        python_version: "3.11",
        pid: 1,
        device,
        devices: [device],
        probe: [{ backend: "cpu", matched: true, reason: "always" }],
        backend_version: null,
        extra_field: "newer workers may add fields",
      },
      { type: "result", id: "a", result: {} },
      {
        type: "error",
        id: null,
        error: { code: "protocol_error", message: "m", recoverable: true },
      },
      { type: "progress", id: "a", progress: 1, total: 2 },
      { type: "pong", id: "p", time_s: 0.1 },
    ];
    for (const m of msgs) expect(parseWorkerMessage(m)).toMatchObject({ ok: true });
  });

  it("reports an invalid message with its id and never throws", () => {
    expect(parseWorkerMessage({ type: "result", id: "a" })).toMatchObject({ ok: false, id: "a" });
    expect(parseWorkerMessage({ type: "surprise", id: 3 })).toMatchObject({ ok: false, id: null });
    expect(parseWorkerMessage({})).toMatchObject({ ok: false });
    const bad = parseWorkerMessage({ type: "error", id: "z", error: { code: "", message: 1 } });
    expect(bad.ok).toBe(false);
    if (!bad.ok) expect(bad.reason).toMatch(/invalid error message/);
  });
});

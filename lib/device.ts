// The one parser of device strings (`cpu`, `tpu`, `tpu:3`, `cuda:1`, `auto`, `default`): a kind and,
// for a chip, its index. In lib/, the dependency-free leaf every room may import.

/**
 * The device kinds a worker reports and a device string may name: the one list that schemas,
 * patterns and types derive from (test/unit/one_source.test.ts refuses a second).
 */
export const DEVICE_KINDS = ["cpu", "cuda", "tpu", "xla"] as const;
export type DeviceKind = (typeof DEVICE_KINDS)[number];

/** The kinds as a regular-expression alternation (`cpu|cuda|tpu|xla`), for patterns over device strings. */
export const DEVICE_KIND_ALTERNATION = DEVICE_KINDS.join("|");

/** Whether a string is one of DEVICE_KINDS. */
export function isDeviceKind(s: unknown): s is DeviceKind {
  return (DEVICE_KINDS as readonly unknown[]).includes(s);
}

export interface ParsedDevice {
  /** `tpu`, `cuda`, `cpu`, `xla`, `auto`, `default`, or whatever precedes the colon. */
  kind: string;
  /** The chip index for `kind:N`; null for a bare kind. */
  index: number | null;
}

export function parseDevice(device: string): ParsedDevice {
  const i = device.indexOf(":");
  if (i < 0) return { kind: device, index: null };
  const n = Number(device.slice(i + 1));
  return { kind: device.slice(0, i), index: Number.isInteger(n) && n >= 0 ? n : null };
}

/** The kind a device string names: `tpu:3` → `tpu`. */
export function deviceKind(device: string): string {
  return parseDevice(device).kind;
}

/** Whether a device string names one chip (`tpu:3`) rather than a kind (`tpu`). */
export function namesChip(device: string): boolean {
  return device.includes(":");
}

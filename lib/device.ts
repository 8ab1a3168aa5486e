// The one parser of device strings (`cpu`, `tpu`, `tpu:3`, `cuda:1`, `auto`, `default`): a kind and,
// for a chip, its index. In lib/, the dependency-free leaf every room may import.

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

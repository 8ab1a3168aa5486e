// Human units for messages and status. In lib/, the dependency-free leaf every room may import.

/** Bytes in binary units ("1.5 GiB"); negative amounts keep their sign ("-2.0 MiB"). */
export function formatBytes(n: number): string {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = n;
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return i === 0 ? `${Math.round(v)} B` : `${v.toFixed(1)} ${units[i]}`;
}

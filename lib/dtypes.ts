// The tensor dtypes the wire carries and their item sizes: one table for the framing, the
// tensor codecs and the memory estimate. In lib/, the dependency-free leaf every room may import.

export const TENSOR_DTYPES = [
  "float32",
  "float16",
  "bfloat16",
  "float64",
  "int64",
  "int32",
  "int16",
  "int8",
  "uint8",
  "bool",
] as const;
export type TensorDtype = (typeof TENSOR_DTYPES)[number];

export const DTYPE_ITEMSIZE: Readonly<Record<TensorDtype, number>> = Object.freeze({
  float32: 4,
  float16: 2,
  bfloat16: 2,
  float64: 8,
  int64: 8,
  int32: 4,
  int16: 2,
  int8: 1,
  uint8: 1,
  bool: 1,
});

export function isTensorDtype(d: string): d is TensorDtype {
  return Object.hasOwn(DTYPE_ITEMSIZE, d);
}

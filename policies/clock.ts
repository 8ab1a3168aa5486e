/** Milliseconds since the epoch; injected everywhere so tests drive time. */
export type Clock = () => number;
export const systemClock: Clock = () => Date.now();

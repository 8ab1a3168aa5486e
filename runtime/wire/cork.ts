// Writes made in one turn of the event loop leave as one syscall. A response, or a frame to the
// worker, written by each of many concurrent calls that resume together (after a group commit,
// a batch's replies) would otherwise be a write() and a wake-up of the reader each; corked until
// the microtasks queued so far have run, they go out as one writev. A lone write is delayed only
// until the current microtask queue drains (no timer, no extra event-loop turn).

const corked = new WeakSet<NodeJS.WritableStream>();

/** Corks `stream` for the rest of this turn (once; later writes in the turn join the batch). */
export function corkForTurn(
  stream: NodeJS.WritableStream & { cork?: () => void; uncork?: () => void },
): void {
  if (!stream.cork || !stream.uncork || corked.has(stream)) return;
  corked.add(stream);
  stream.cork();
  queueMicrotask(() => {
    corked.delete(stream);
    stream.uncork!();
  });
}

// How far `pip install` has got, for the set-up's percentage and step line. pip prints a line per
// package while it resolves and downloads, then nothing while it unpacks and installs (torch:
// a minute or two), so the percentage sat still there. Here the lines name the step, and the time
// since the last one moves the percentage on, ever slower, never reaching the end of the span.

/** Where the set-up stands inside pip: a percentage within [from, to) and a step line. */
export interface PipState {
  percent: number;
  step: string;
}

/** The share of the span lines and time may fill while pip resolves and downloads. */
const FETCH_SHARE = 0.6;

export class PipProgress {
  private lines = 0;
  private phaseStart: number;
  private phaseBase: number;
  private installing = false;
  private step = "resolving the requirements";
  private last: number;

  constructor(
    private readonly from: number,
    private readonly to: number,
    private readonly now: () => number = Date.now,
  ) {
    this.phaseStart = now();
    this.phaseBase = from;
    this.last = from;
  }

  /** A line pip printed: it may name the package being fetched or start the install. */
  line(text: string): PipState {
    this.lines++;
    const collecting = /^Collecting (\S+)/.exec(text);
    const downloading = /^Downloading (?:\S*\/)?([A-Za-z0-9_.]+?)-\d\S* \(([^)]+)\)/.exec(text);
    const installing = /^Installing collected packages: (.*)$/.exec(text);
    if (installing) {
      const names = installing[1]!.split(", ");
      const shown = names.slice(0, 3).join(", ") + (names.length > 3 ? ", …" : "");
      // Unpacking and installing is silent: from here time alone moves the percentage.
      this.phaseBase = this.percent();
      this.phaseStart = this.now();
      this.installing = true;
      this.step = `installing ${names.length} packages (${shown})`;
    } else if (downloading) this.step = `downloading ${downloading[1]} (${downloading[2]})`;
    else if (collecting) this.step = `collecting ${collecting[1]}`;
    return this.state();
  }

  /** The state now: called while pip is silent, it still moves. */
  state(): PipState {
    const s = (this.now() - this.phaseStart) / 1000;
    const step = this.installing ? `${this.step}, ${Math.round(s)} s so far` : this.step;
    return { percent: this.percent(), step };
  }

  private percent(): number {
    const s = (this.now() - this.phaseStart) / 1000;
    const span = this.to - this.from;
    const p = this.installing
      ? // The rest of the span, most of it within the first minutes (torch's install).
        this.phaseBase + (this.to - this.phaseBase) * 0.95 * (1 - Math.exp(-s / 90))
      : // ~40 packages print ~3 lines each; a slow download moves it by time.
        this.from + FETCH_SHARE * span * (1 - Math.exp(-(this.lines / 80 + s / 120)));
    // Never backwards (a new phase starts where the last left off).
    this.last = Math.max(this.last, p);
    return this.last;
  }
}

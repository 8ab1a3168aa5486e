// The per-user folder of an installed package (<home>: venv, setup.json, the catalog, models,
// data) is trusted the way ssh trusts ~/.ssh: the server executes <home>/venv/bin/python, reads
// the set-up's record and the catalog there. So whoever can write any of it runs code as the
// server's user. The folder is refused unless it is this user's (or root's), and neither it, the
// folders above it, nor what the server executes or trusts inside it can be written by anyone else.
import { lstatSync, mkdirSync, realpathSync, statSync, type Stats } from "node:fs";
import { dirname, isAbsolute, join, relative, sep } from "node:path";
import type { InstallLayout } from "../config/install_layout.js";

/** Why the folder is refused, and the command that mends it. */
export class UserHomeRefused extends Error {
  constructor(
    readonly path: string,
    readonly why: string,
    readonly mend: string,
  ) {
    super(
      `refusing the per-user folder: ${why}; whoever can write it runs code as this user. Mend: ${mend} (docs/security.md, "The per-user folder")`,
    );
  }
}

const octal = (mode: number) => (mode & 0o7777).toString(8).padStart(3, "0");
const STICKY = 0o1000;

/**
 * Null when `layout`'s per-user folder may be trusted by the user `me` (or there is none: a
 * clone, or no uid to compare on Windows); else why not. A folder that does not exist yet is
 * fine: openUserHome makes it 0700.
 */
export function checkUserHome(
  layout: InstallLayout,
  me: number | null = process.getuid?.() ?? null,
): UserHomeRefused | null {
  const home = layout.home;
  if (layout.kind !== "package" || !home || me === null) return null;
  let link: Stats;
  try {
    link = lstatSync(home);
  } catch {
    return aboveMissing(home, me);
  }
  let real: string;
  let st: Stats;
  try {
    real = realpathSync(home);
    st = statSync(real);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    return code === "ENOENT"
      ? new UserHomeRefused(home, `${home} is a link to nothing`, `rm ${home}`)
      : new UserHomeRefused(
          home,
          `${home} cannot be looked into (${code}): it leads into another user's folder`,
          `rm ${home}, or use a folder of your own (--home DIR)`,
        );
  }
  const via = link.isSymbolicLink() ? `${home} (a link to ${real})` : home;
  const unlink = link.isSymbolicLink() ? `rm ${home} (the link), then run \`tpu-mcp setup\`` : "";
  if (!st.isDirectory()) return new UserHomeRefused(home, `${via} is not a folder`, `rm ${home}`);
  // Root's is fine too: a machine-wide install the server's user only reads (the container image).
  if (st.uid !== me && st.uid !== 0)
    return new UserHomeRefused(
      home,
      `${via} is owned by uid ${st.uid}, not by this user (uid ${me})`,
      unlink || `chown -R ${me} ${real}, or use a folder of your own (--home DIR)`,
    );
  if (st.mode & 0o022)
    return new UserHomeRefused(
      home,
      `${via} is writable by ${whom(st.mode)} (mode ${octal(st.mode)})`,
      unlink || `chmod 700 ${real}`,
    );
  // Whoever can rename entries of a folder above it can put another folder in its place.
  const parent = realOr(dirname(home));
  for (const dir of new Set([...ancestors(real), parent, ...ancestors(parent)])) {
    const p = folderAbove(dir, me);
    if (p) return p;
  }
  for (const path of trusted(layout, real)) {
    const p = inside(real, path, me);
    if (p) return p;
  }
  return null;
}

/** Makes the per-user folder (0700, this user's) when missing, then refuses it as checkUserHome. */
export function openUserHome(layout: InstallLayout): void {
  if (layout.kind !== "package" || !layout.home) return;
  const before = checkUserHome(layout);
  if (before) throw before;
  mkdirSync(layout.home, { recursive: true, mode: 0o700 });
  const after = checkUserHome(layout);
  if (after) throw after;
}

/** What the server executes or trusts in the folder, each path below `real`. */
function trusted(layout: InstallLayout, real: string): string[] {
  const home = layout.home!;
  const under = (p: string) => {
    const r = relative(home, p);
    return r && !r.startsWith("..") && !isAbsolute(r) ? join(real, r) : null;
  };
  const paths = [layout.python, layout.vllmPython, layout.setupProgress!, layout.catalog];
  return paths.map(under).filter((p): p is string => p !== null);
}

/**
 * Each existing step from the folder down to `path`: this user's (or root's), and not writable by
 * a group or others that can reach it (a 0700 folder keeps everyone out of what is below). A link
 * (the venv's python → /usr/bin/python3) must be this user's, and what it points at this user's or
 * root's and writable by no one else.
 */
function inside(real: string, path: string, me: number): UserHomeRefused | null {
  const home = statSync(real);
  // Which of group and others can still walk down to this step.
  let reach = home.mode & 0o011;
  let at = real;
  for (const part of relative(real, path).split(sep)) {
    at = join(at, part);
    let st: Stats;
    try {
      st = lstatSync(at);
    } catch {
      return null; // not made yet: nothing to trust
    }
    if (st.uid !== me && st.uid !== 0)
      return new UserHomeRefused(
        at,
        `${at} is owned by uid ${st.uid}, not by this user (uid ${me})`,
        `rm -r ${at}, then run \`tpu-mcp setup\``,
      );
    if (st.isSymbolicLink()) {
      let target: Stats;
      try {
        target = statSync(at);
      } catch {
        return null;
      }
      if ((target.uid !== me && target.uid !== 0) || target.mode & 0o022)
        return new UserHomeRefused(
          at,
          `${at} links to ${realOr(at)}, owned by uid ${target.uid} with mode ${octal(target.mode)}`,
          `rm -r ${at}, then run \`tpu-mcp setup\``,
        );
      continue;
    }
    const writable = st.mode & ((reach & 0o010 ? 0o020 : 0) | (reach & 0o001 ? 0o002 : 0));
    if (writable)
      return new UserHomeRefused(
        at,
        `${at} is writable by ${whom(writable)} (mode ${octal(st.mode)})`,
        `chmod go-w ${at}`,
      );
    if (st.isDirectory()) reach &= st.mode & 0o011;
  }
  return null;
}

/** A folder above the per-user one: root's or this user's, and others may not rename in it. */
function folderAbove(dir: string, me: number): UserHomeRefused | null {
  const st = statSync(dir);
  if (st.uid !== me && st.uid !== 0)
    return new UserHomeRefused(
      dir,
      `${dir}, a folder above it, is owned by uid ${st.uid}: that user can replace it`,
      "use a per-user folder under folders of your own or root's (--home DIR)",
    );
  if (st.mode & 0o022 && !(st.mode & STICKY))
    return new UserHomeRefused(
      dir,
      `${dir}, a folder above it, is writable by ${whom(st.mode)} (mode ${octal(st.mode)}): they can replace it`,
      `chmod go-w ${dir}, or use another folder (--home DIR)`,
    );
  return null;
}

/** A folder not made yet: the nearest existing folder above it must hold. */
function aboveMissing(home: string, me: number): UserHomeRefused | null {
  let dir = dirname(home);
  while (dirname(dir) !== dir) {
    try {
      lstatSync(dir);
      break;
    } catch {
      dir = dirname(dir);
    }
  }
  for (const d of ancestors(realOr(dir)).concat(realOr(dir))) {
    const p = folderAbove(d, me);
    if (p) return p;
  }
  return null;
}

/** Every folder above `p`, up to the root. */
function ancestors(p: string): string[] {
  const out: string[] = [];
  for (let d = dirname(p); ; d = dirname(d)) {
    out.push(d);
    if (dirname(d) === d) return out;
  }
}

function realOr(p: string): string {
  try {
    return realpathSync(p);
  } catch {
    return p;
  }
}

function whom(mode: number): string {
  const g = mode & 0o020;
  const o = mode & 0o002;
  return g && o ? "its group and other users" : g ? "its group" : "other users";
}

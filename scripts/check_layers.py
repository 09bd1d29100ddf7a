#!/usr/bin/env python3
"""Checks that no #include points up a layer (README.md "Layout"):

  server -> runner -> engine modules -> backend -> kernels, with engine/core below them all.

Within the engine modules the order is spec (proposers) -> scheduler -> draft (draft models) ->
model -> verify (verification, tree sampling, tree layout, budgets) -> sampling / kv_cache /
tokenizer. A file may include its own layer and the layers below it; kernels include only
kernels. Prints every violation (file:line, the include, both layers) and exits 1 if any.

  python3 scripts/check_layers.py [REPO_ROOT]
"""
import pathlib
import re
import sys

# Higher ranks may include lower (or equal) ranks.
RANKS = {
    "server": 90,
    "engine/runner": 80,
    "engine/spec": 70,
    "engine/scheduler": 65,
    "engine/draft": 60,
    "engine/model": 50,
    "engine/verify": 40,
    "engine/sampling": 30,
    "engine/kv_cache": 30,
    "engine/tokenizer": 30,
    "engine/backend": 20,
    "kernels": 10,
    "engine/core": 0,
}
SOURCE = {".h", ".cc", ".cu", ".cuh"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def layer_of(path):
    """The layer of a repo-relative path (longest matching prefix), or None."""
    best = None
    for prefix in RANKS:
        if path == prefix or path.startswith(prefix + "/"):
            if best is None or len(prefix) > len(best):
                best = prefix
    return best


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    violations = []
    checked = 0
    for top in ("server", "engine", "kernels"):
        for f in sorted((root / top).rglob("*")):
            if f.suffix not in SOURCE or not f.is_file():
                continue
            rel = f.relative_to(root).as_posix()
            src = layer_of(rel)
            if src is None:
                continue
            checked += 1
            for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                dst = layer_of(m.group(1))
                if dst is None:
                    continue  # generated headers, third-party, tests
                up = RANKS[dst] > RANKS[src]
                # Kernels are device code: they include nothing of the engine, core included.
                if src == "kernels" and dst != "kernels":
                    up = True
                if up:
                    violations.append(f"{rel}:{n}: includes {m.group(1)} ({src} -> {dst})")
    for v in violations:
        print(v)
    print(f"check_layers: {checked} files, {len(violations)} includes pointing up a layer")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Fails when ptxas serialises the warpgroup MMAs of a kernel (issue 4's speed guard).

ptxas answers some code shapes (a wgmma in a data-dependent branch, accumulator registers
touched by other instructions while MMAs are in flight, ...) by inserting a wait after every
wgmma of the function. It says so only in an `info` line (codes C7510-C7520, "wgmma.mma_async
instructions are serialized"), which no warning flag turns into an error, and the kernel stays
correct, only much slower (a 128-key attention variant lost 19-33% to it). This re-runs the
compile commands of the sources that use wgmma (from the build's compile_commands.json) with
`-Xptxas -v` and lists every such line; it first compiles a negative fixture
(tests/cuda/fixtures/wgmma_in_branch.cu) and fails unless that one is reported, so a change
in ptxas's wording cannot turn the check into one that always passes. Register spills of the
same functions are reported too (not an error).

    python3 scripts/check_wgmma_serialization.py --build-dir build-cuda
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

SOURCES = [
    "kernels/attention/paged_tree_attention_mma.cu",
    "kernels/gemm/chunked_gemm_wgmma.cu",
]
FIXTURE = "tests/cuda/fixtures/wgmma_in_branch.cu"
SERIALIZED = re.compile(r"\(C75\d\d\).*serializ", re.IGNORECASE)
SPILL = re.compile(r"Registers are spilled .* in function '([^']+)', (\d+) bytes spill stores")


def ptxas_lines(command, directory, output):
    args = shlex.split(command)
    if "-o" in args:
        args[args.index("-o") + 1] = output
    args += ["-Xptxas", "-v"]
    run = subprocess.run(args, cwd=directory, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"compile failed ({run.returncode}): {' '.join(args)}\n{run.stderr[-2000:]}")
    return (run.stdout + run.stderr).splitlines()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", required=True, help="a CMake build with ARBOR_CUDA=ON")
    ap.add_argument("--source", action="append", help="repo-relative .cu (default: %s)" % SOURCES)
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(args.build_dir, "compile_commands.json")) as f:
        commands = {os.path.realpath(e["file"]): e for e in json.load(f)}
    sources = args.source or SOURCES
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        # The fixture, compiled like the first source (same nvcc, flags, include paths).
        first = commands.get(os.path.realpath(os.path.join(root, sources[0])))
        if first is None:
            sys.exit(f"{sources[0]} is not in {args.build_dir}/compile_commands.json")
        src0 = first["file"]
        fixture_cmd = first["command"].replace(src0, os.path.join(root, FIXTURE))
        lines = ptxas_lines(fixture_cmd, first["directory"], os.path.join(tmp, "fixture.o"))
        if not any(SERIALIZED.search(line) for line in lines):
            sys.exit(f"self-test failed: ptxas reported no serialised wgmma for {FIXTURE}; "
                     "the check cannot see the problem any more (ptxas wording changed?)")
        print(f"self-test: {FIXTURE} reported as serialised (as it must be)")
        for rel in sources:
            entry = commands.get(os.path.realpath(os.path.join(root, rel)))
            if entry is None:
                sys.exit(f"{rel} is not in {args.build_dir}/compile_commands.json")
            lines = ptxas_lines(entry["command"], entry["directory"], os.path.join(tmp, "k.o"))
            bad = [line for line in lines if SERIALIZED.search(line)]
            spills = [m.groups() for m in map(SPILL.search, lines) if m]
            print(f"{rel}: {len(bad)} serialised-wgmma reports; spills: "
                  + (", ".join(f"{b} B in ...{fn[-60:]}" for fn, b in spills) or "none"))
            failures += [f"{rel}: {line.strip()}" for line in bad]
    if failures:
        print("\n".join(failures))
        sys.exit(1)


if __name__ == "__main__":
    main()

"""Trim a binary wheel to what a few entry points need, so it fits a device call's carry.

Keeps the files matching --keep (glob patterns over the wheel's paths), every shared library
of the wheel that a kept ELF file needs (DT_NEEDED, followed transitively, matched by file
name or SONAME), and the .dist-info files; drops everything else and rewrites RECORD to list
exactly the kept files, so `pip install --no-index --no-deps` installs the result. Prints what
it kept and dropped, the sizes, and the libraries the kept files load from the system; fails,
naming it, when a pattern matched nothing (a renamed file in a new release must not silently
produce a wheel that cannot import).

    python3 trim_wheel.py IN.whl OUT.whl --keep 'pkg/*.py' --keep 'pkg/engine.so' [--drop GLOB]

--drop removes a matched file even when a kept file needs it (for libraries the target OS
provides or that are loaded lazily and not needed on the measured path).
"""

import argparse
import base64
import fnmatch
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile


def is_elf(data: bytes) -> bool:
    return data[:4] == b"\x7fELF"


def dynamic(path: str) -> tuple[list[str], str | None]:
    """The DT_NEEDED entries and the SONAME of one ELF file (binutils' readelf)."""
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    needed, soname = [], None
    for line in out.splitlines():
        if "(NEEDED)" in line:
            needed.append(line.split("[", 1)[1].rstrip("]"))
        elif "(SONAME)" in line:
            soname = line.split("[", 1)[1].rstrip("]")
    return needed, soname


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def trim(src: str, dst: str, keep: list[str], drop: list[str]) -> dict:
    with zipfile.ZipFile(src) as zin:
        infos = [i for i in zin.infolist() if not i.is_dir()]
        names = [i.filename for i in infos]
        unmatched = [p for p in keep if not any(fnmatch.fnmatch(n, p) for n in names)]
        if unmatched:
            raise SystemExit(f"trim_wheel: {os.path.basename(src)}: no file matches --keep "
                             f"{', '.join(unmatched)}: the wheel's layout changed; list it with "
                             f"`python3 -m zipfile -l {src}` and fix the pattern")
        tmp = tempfile.mkdtemp(prefix="trim-wheel-")
        try:
            # Every ELF file of the wheel, by the names a DT_NEEDED entry can use for it.
            elf_by_name, needs = {}, {}
            for n in names:
                data = zin.read(n)
                if not is_elf(data):
                    continue
                p = os.path.join(tmp, "f")
                with open(p, "wb") as f:
                    f.write(data)
                needed, soname = dynamic(p)
                needs[n] = needed
                elf_by_name.setdefault(os.path.basename(n), []).append(n)
                if soname:
                    elf_by_name.setdefault(soname, []).append(n)
        finally:
            shutil.rmtree(tmp)

        dist_info = [n for n in names if n.split("/", 1)[0].endswith(".dist-info")]
        dropped_by_rule = {n for n in names if any(fnmatch.fnmatch(n, p) for p in drop)}
        kept = {n for n in names if any(fnmatch.fnmatch(n, p) for p in keep)} | set(dist_info)
        kept -= dropped_by_rule
        todo = [n for n in kept if n in needs]
        while todo:
            for lib in needs[todo.pop()]:
                for n in elf_by_name.get(lib, []):
                    if n not in kept and n not in dropped_by_rule:
                        kept.add(n)
                        todo.append(n)

        record = next((n for n in dist_info if n.endswith("/RECORD")), None)
        if record is None:
            raise SystemExit(f"trim_wheel: {src} has no .dist-info/RECORD: not a wheel")
        lines = []
        with zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
            for info in infos:
                if info.filename not in kept or info.filename == record:
                    continue
                data = zin.read(info)
                zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
                lines.append(record_line(info.filename, data))
            lines.append(f"{record},,")
            zout.writestr(record, "\n".join(lines) + "\n")
    kept_bytes = sum(i.file_size for i in infos if i.filename in kept)
    inside = {name for name, files in elf_by_name.items() if any(f in kept for f in files)}
    outside = sorted({lib for n in kept if n in needs for lib in needs[n]} - inside)
    return {
        "from_system": outside,
        "wheel": os.path.basename(dst),
        "kept_files": len(kept),
        "dropped_files": len(names) - len(kept),
        "kept_bytes": kept_bytes,
        "in_bytes": os.path.getsize(src),
        "out_bytes": os.path.getsize(dst),
        "kept_libs": sorted(n for n in kept if n in needs),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--keep", action="append", default=[], help="glob of wheel paths to keep")
    ap.add_argument("--drop", action="append", default=[], help="glob of wheel paths never kept")
    ap.add_argument("-v", "--verbose", action="store_true", help="list every shared library kept")
    a = ap.parse_args()
    if not a.keep:
        ap.error("give at least one --keep pattern (the entry points the trimmed wheel must import)")
    r = trim(a.src, a.dst, a.keep, a.drop)
    print(f"trim_wheel: {r['wheel']}: kept {r['kept_files']} files ({r['kept_bytes'] / 1e6:.1f} MB "
          f"unpacked), dropped {r['dropped_files']}; {r['in_bytes'] / 1e6:.1f} MB -> "
          f"{r['out_bytes'] / 1e6:.1f} MB")
    print(f"  {len(r['kept_libs'])} shared libraries kept" + (": " + ", ".join(r["kept_libs"]) if a.verbose else ""))
    print(f"  loads from the system: {', '.join(r['from_system'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Copy the test binaries that `cargo test --no-run --message-format=json` (on stdin) built into
.devbin/tests, printing each name: the executable's own name (hash included), or with --by-target
`<package>-<target>` (the names scripts/device/run.sh's stages look for)."""
import json
import os
import shutil
import sys

by_target = "--by-target" in sys.argv[1:]
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        exe = m["executable"]
        if by_target:
            name = m["package_id"].split("#")[1].split("@")[0] + "-" + m["target"]["name"]
        else:
            name = os.path.basename(exe)
        shutil.copy(exe, os.path.join(".devbin/tests", name))
        print(name)

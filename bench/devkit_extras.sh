#!/usr/bin/env bash
# The project's own needs beyond ../shared/devkit (Ray, MLflow, pandas, ...) on the lent GPU machine:
# scipy (BM25's sparse products) and PyStemmer (the analyzer), as CPython 3.12 wheels without their tests,
# stored uncompressed in .devkit/extras.tar.xz (about 20 MiB) and listed in .devkit/needs.txt, so that
# `bash .devkit/install.sh` installs them with the rest. Run after `bash ../shared/devkit/build.sh .`:
#   bash bench/devkit_extras.sh            # then carry .devkit/extras.tar.xz with install.sh and needs.txt
#   bash bench/devkit_extras.sh PyStemmer  # only PyStemmer (0.5 MiB): the lent machines have scipy, and the
#                                          # kit, this and the project then fit one 64 MiB call
set -euo pipefail
cd "$(dirname "$0")/.."
kit=.devkit
[ -f "$kit/needs.txt" ] || { echo "error: build the kit first: bash ../shared/devkit/build.sh ." >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --only-binary=:all: --python-version 3.12 --no-deps -d "$tmp/in" \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  $(for p in "${@:-scipy PyStemmer}"; do for q in $p; do case $q in scipy) echo "scipy>=1.17,<2";; PyStemmer) echo "PyStemmer>=3.1,<4";; *) echo "error: unknown extra $q" >&2; exit 2;; esac; done; done)
python3 - "$tmp/in" "$tmp/out" "$kit/needs.txt" <<'PY'
import os, sys, zipfile
src, out, needs = sys.argv[1:4]
os.makedirs(out)
rows = [line for line in open(needs) if line.split()[4] != "extras"]
for name in sorted(os.listdir(src)):
    zin = zipfile.ZipFile(os.path.join(src, name))
    keep = [i for i in zin.infolist() if "/tests/" not in i.filename]
    kept = {i.filename for i in keep}
    with zipfile.ZipFile(os.path.join(out, name), "w", zipfile.ZIP_STORED) as zout:
        for info in keep:
            data = zin.read(info.filename)
            if info.filename.endswith(".dist-info/RECORD"):  # the removed tests leave the RECORD too
                data = "".join(l + "\n" for l in data.decode().splitlines() if l.split(",")[0] in kept).encode()
            zout.writestr(info, data, compress_type=zipfile.ZIP_STORED)
    project, version = name.split("-")[:2]
    floor = {"scipy": "1.17", "pystemmer": "3.1"}[project.lower()]
    rows.append(f"{project} {version} {floor} - extras {name}\n")
open(needs, "w").writelines(rows)
PY
tar -C "$tmp/out" -cf - . | xz -T2 -6 > "$kit/extras.tar.xz"
ls -l "$kit/extras.tar.xz"

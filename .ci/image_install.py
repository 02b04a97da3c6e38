"""The image's install steps without docker: infra/Dockerfile's own RUN commands from the runtime lock on
(`COPY ... requirements.lock` and after), run as written in a clean virtualenv over a copy of what the
image COPYs (with .dockerignore applied the way the image's COPY lines need it: whole files and folders).

What differs from `docker build`, and why: the base image and Python (this machine's; the locks hold for
3.11 and 3.12), and torch, which comes first as `make install` takes it (the machine's CPU build) instead of
the image's CUDA build, whose check in the image's torch RUN is left out. Exit status: the first failing
step's. CI runs it (`make image-check`, from .ci/run).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "infra" / "Dockerfile"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile's last stage, continuation lines joined, comments left out."""
    text = re.sub(r"^\s*#.*\n", "", text, flags=re.M)
    text = re.sub(r"\\\n", " ", text)
    steps = [tuple(line.strip().split(None, 1)) for line in text.splitlines() if line.strip()]
    last_from = max(i for i, (op, *_) in enumerate(steps) if op.upper() == "FROM")
    return [(op.upper(), rest[0] if rest else "") for op, *rest in steps[last_from + 1 :]]


def image_steps(text: str) -> tuple[list[str], list[str]]:
    """What the image copies into its work folder and the RUN commands from the runtime lock's COPY on."""
    copied, runs, started = [], [], False
    for op, args in instructions(text):
        if op == "COPY":
            sources = [a for a in args.split() if not a.startswith("--")][:-1]
            started = started or "requirements.lock" in sources
            copied += sources
        elif op == "RUN" and started:
            runs.append(args)
    if not runs:
        raise SystemExit("image_install: no RUN after `COPY ... requirements.lock` in infra/Dockerfile")
    return copied, runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch", required=True, help="torch version (the Makefile's TORCH_VERSION)")
    parser.add_argument("--torch-index", default=None, help="pip index for torch (the Makefile's TORCH_INDEX)")
    parser.add_argument("--uv", required=True, help="the uv binary (the Makefile's)")
    args = parser.parse_args()
    copied, runs = image_steps(DOCKERFILE.read_text())
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="image-install-") as tmp:
        app, venv = Path(tmp) / "app", Path(tmp) / "venv"
        app.mkdir()
        for source in copied:
            (shutil.copytree if (ROOT / source).is_dir() else shutil.copy2)(ROOT / source, app / source)
        uv = str(Path(args.uv).resolve())
        subprocess.run([uv, "venv", "--quiet", "--seed", "--python", sys.executable, str(venv)], check=True)
        env = {**os.environ, "VIRTUAL_ENV": str(venv), "PATH": f"{venv}/bin:{Path(uv).parent}:{os.environ['PATH']}"}
        index = ["--index-url", args.torch_index] if args.torch_index else []
        torch = [f"{venv}/bin/python", "-m", "pip", "install", "--quiet", "--no-deps", f"torch=={args.torch}", *index]
        for command in [torch, *runs]:
            print("image_install:", " ".join(command) if isinstance(command, list) else command, flush=True)
            done = subprocess.run(command if isinstance(command, list) else ["bash", "-c", command], cwd=app, env=env)
            if done.returncode:
                return done.returncode
    print(f"image_install: the image's install steps passed in {time.monotonic() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

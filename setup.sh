#!/usr/bin/env bash
# One-time set-up on a fresh machine: a venv with the pinned packages, g++ for the native decoding
# engine, and Debian's Chromium for the browser tests. Safe to run again: it skips what is already there.
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
if ! .venv/bin/python -c "import sr_blockwise, torch, gradio, playwright, xdist, requests, hypothesis" 2>/dev/null; then
    .venv/bin/pip install --quiet -e ".[dev]"
fi
# face detection (sr_blockwise/faces.py): MTCNN and its weights, from a wheel that pins torch<2.3,
# numpy<2 and Pillow<10.3; its detector runs on the project's pins, so it goes in without them
if ! .venv/bin/python -c "import facenet_pytorch" 2>/dev/null; then
    .venv/bin/pip install --quiet --no-deps facenet-pytorch==2.6.0
fi
if ! command -v g++ >/dev/null 2>&1; then  # builds the native decoding engine on first use
    if [ "$(id -u)" = 0 ]; then
        (apt-get update -qq && apt-get install -y -qq g++) >/dev/null
    else
        echo "setup: g++ is missing; decoding falls back to the slower PyTorch engine" >&2
    fi
fi
if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        (apt-get update -qq && apt-get install -y -qq chromium) >/dev/null
    else
        echo "setup: chromium is missing; install Debian's chromium for the browser tests" >&2
    fi
fi

#!/usr/bin/env bash
# Sets up a fresh machine: Debian packages for speech synthesis and the microphone,
# and, beside them, a virtual environment with voxrt and its test and client extras.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v espeak-ng >/dev/null || need+=(espeak-ng)
command -v sox >/dev/null || need+=(sox)
command -v flite >/dev/null || need+=(flite)  # a second speech engine for benchmarks/speech.py
command -v chromium >/dev/null || need+=(chromium)  # the browser page's test, driven by Playwright
command -v haproxy >/dev/null || need+=(haproxy)  # deploy/haproxy.cfg, tested in front of 2 replicas
ldconfig -p 2>/dev/null | grep -q libportaudio.so.2 || need+=(libportaudio2)
# apt's minutes on a bare machine overlap pip's: neither needs the other.
apt=""
if ((${#need[@]})); then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null) &
        apt=$!
    else
        echo "setup: please install ${need[*]} (Debian/Ubuntu: sudo apt-get install ${need[*]})" >&2
    fi
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
# Playwright drives the system chromium: it must never fetch browsers of its own.
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
# pip byte-compiles on one core; compileall on all of them takes ~10 s off a fresh setup.
# (Some packages ship files for other Pythons that never compile: its status is not ours.)
.venv/bin/pip install -q --disable-pip-version-check --no-compile -e '.[test,clients,multilingual]'
# A real telephone call with its transcript and turns (benchmarks/conversation_set.py) ships in
# pyannote.audio's wheel: its files alone, without the packages it needs to run (another torch).
.venv/bin/pip install -q --disable-pip-version-check --no-compile --no-deps 'pyannote.audio==4.0.7'
# The semantic end-of-turn model (smart-turn v3.2, BSD-2-Clause) ships in pipecat-ai's wheel:
# its file alone is read (voxtral/turn_model.py). The tests also run its Deepgram STT plugin,
# with what that imports (the test extra); its other requirements pin older soxr and protobuf.
.venv/bin/pip install -q --disable-pip-version-check --no-compile --no-deps 'pipecat-ai==1.14.0'
.venv/bin/python -m compileall -q -j 0 .venv/lib/python3*/site-packages >/dev/null || true
[ -z "$apt" ] || wait "$apt"  # its failure is setup's

#!/usr/bin/env bash
# The Java client's tests (tests/android_bridge/test_java_client.py) compile it with the
# machine's `javac --release 8`; install a JDK from Debian's packages when none is on PATH.
set -euo pipefail
if command -v javac >/dev/null 2>&1 && command -v java >/dev/null 2>&1; then
    exit 0
fi
echo "ensure-jdk: no javac on PATH; installing Debian's openjdk-17-jdk-headless" >&2
sudo=""
if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "ensure-jdk: need root or sudo to install a JDK" >&2; exit 1; }
    sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends openjdk-17-jdk-headless >/dev/null
command -v javac >/dev/null 2>&1 || { echo "ensure-jdk: javac still missing after the install" >&2; exit 1; }

#!/usr/bin/env bash
# `make web DSN=... [PORT=...]`: install gd-web's Debian packages when missing
# (as root), then serve the dashboard on 127.0.0.1 as the DSN's role.
set -euo pipefail
dsn=${1:-${GD_WEB_DSN:-}}
port=${2:-8321}
[[ -n $port ]] || port=8321
if [[ -z $dsn ]]; then
    echo "usage: make web DSN='dbname=app user=gd_dashboard' [PORT=8321]" >&2
    exit 2
fi
packages=(python3-starlette python3-uvicorn python3-jinja2 python3-psycopg python3-psycopg-pool python3-multipart)
missing=()
for p in "${packages[@]}"; do
    [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" == "install ok installed" ]] || missing+=("$p")
done
if ((${#missing[@]})); then
    if [[ $EUID -ne 0 ]]; then
        echo "gd-web: missing packages (${missing[*]}) and not root: install them first" >&2
        exit 1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
cd "$(dirname "${BASH_SOURCE[0]}")"
exec /usr/bin/python3 -m gd_web --dsn "$dsn" --port "$port"

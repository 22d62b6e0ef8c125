#!/usr/bin/env bash
# RocksDB's development package, for benchmarks/tiered_store_probe.py (the store comparison of
# docs/tiered_tables.md).  Debian packages RocksDB 7.8 (librocksdb-dev); the product itself does not link it.
set -euo pipefail
if [ -f /usr/include/rocksdb/db.h ]; then
  echo "librocksdb-dev is installed"
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq librocksdb-dev >/dev/null
echo "librocksdb-dev installed"

#!/bin/sh
echo "bazel coverage is not supported by this offline workspace (no @remote_coverage_tools)." >&2
exit 1

#!/usr/bin/env bash
# A build without KVF_FAULT_INJECTION refuses every test-only switch by name
# (KVF_TEST_* in the environment, --test-* flags) and nothing else; the test
# harness's own variables (tests/run.sh) pass.
set -euo pipefail
bin=$1
fail() { echo "FAIL: $*" >&2; exit 1; }
expect_refused() {   # what_to_name cmd...
    local name=$1; shift
    local out rc=0
    out=$("$@" 2>&1) || rc=$?
    [[ $rc -eq 2 ]] || fail "exit $rc (want 2) for: $* ($out)"
    grep -q -- "$name is a test-only switch; this build (without KVF_FAULT_INJECTION) refuses it" <<< "$out" ||
        fail "no refusal naming $name: $out"
    echo "ok: refused $name"
}
clean=(env -u KVF_TEST_NO_RELEASE -u KVF_TEST_PULL_DELAY -u KVF_TEST_NO_BLOCK_ZERO)
expect_refused KVF_TEST_NO_RELEASE "${clean[@]}" KVF_TEST_NO_RELEASE=yes "$bin"
expect_refused KVF_TEST_PULL_DELAY "${clean[@]}" KVF_TEST_PULL_DELAY=2s "$bin"
expect_refused KVF_TEST_NO_BLOCK_ZERO "${clean[@]}" KVF_TEST_NO_BLOCK_ZERO=1 "$bin"
expect_refused KVF_TEST_ANYTHING "${clean[@]}" KVF_TEST_ANYTHING=1 "$bin"
expect_refused --test-no-release "${clean[@]}" "$bin" --model m --test-no-release yes
expect_refused --test-pull-delay "${clean[@]}" "$bin" --test-pull-delay=2s
"${clean[@]}" KVF_TEST_FUZZ=0 KVF_TEST_REFERENCE=0 KVF_TEST_SANITIZERS=0 "$bin" --model m ||
    fail "harness variables or ordinary flags refused"
echo "ok: harness variables and ordinary flags pass"

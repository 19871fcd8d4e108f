#!/usr/bin/env python3
"""The layering check passes on this tree and fails, naming file and line, on
planted upward and sideways includes in a copy of it."""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
CHECK = [sys.executable, os.path.join(HERE, "check_includes.py")]
LAYER_DIRS = ["base", "kernels", "common", "proto", "transfer", "daemon", "prefill", "decode", "tools",
              "deploy"]


def run(root):
    p = subprocess.run(CHECK + ["--root", root], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout


def plant(root, rel, line):
    """Insert @line after the file's first #include; return its line number."""
    path = os.path.join(root, rel)
    with open(path) as f:
        lines = f.readlines()
    at = next(i for i, l in enumerate(lines) if l.startswith("#include")) + 1
    lines.insert(at, line + "\n")
    with open(path, "w") as f:
        f.writelines(lines)
    return at + 1


def check_floor():
    """base/ is the ground floor at the top level: it links nothing of the tree, every other
    layer with C sources stands on it, and no folder named base/ hides inside another."""
    sys.path.insert(0, HERE)
    import check_includes as ci
    assert ci.LAYERS.get("base") == [], f"base/ must use nothing of the tree: {ci.LAYERS.get('base')}"
    assert os.path.isdir(os.path.join(ROOT, "base")), "no top-level base/ folder"
    for layer in ci.LAYERS:
        if layer in ("base", "proto"):
            continue
        assert "base" in ci.closure(layer), f"{layer} does not stand on base/"
    nested = [l for l in ci.LAYERS if l.endswith("/base")]
    assert not nested, f"a base layer inside another folder: {nested}"
    print(f"ok: base/ is the top-level floor under {len(ci.LAYERS) - 2} layers")


def main():
    check_floor()
    rc, out = run(ROOT)
    assert rc == 0, f"layering check fails on the tree:\n{out}"

    cases = [  # (file, planted include, text the report must carry)
        # the bottom floor stands on nothing: not on the kernels, not on the engine
        ("base/kvf_status.c", '#include "kvf_kern.h"', "from kernels; base may use nothing"),
        ("base/kvf_log.c", '#include "kvf_engine.h"', "from common/engine"),
        ("base/kvf_json.c", '#include "kvf_side_channel.h"', "from transfer/channel; base may use nothing"),
        # kernels stand on base alone
        ("kernels/kvf_gemm.c", '#include "kvf_model_config.h"', "from common/model; kernels may use base"),
        ("prefill/kvf_lease.c", '#include "kvf_decode_server.h"', "from decode"),
        # daemon scaffolding is above transfer, below the roles and the tools
        ("transfer/ucx/kvf_ucx_agent.c", '#include "kvf_role.h"', "from daemon"),
        ("daemon/kvf_role.c", '#include "kvf_prefill_server.h"', "from prefill"),
        ("daemon/kvf_role.c", '#include "kvf_cmds.h"', "from tools"),
        # the tools are not deploy, and deploy/proxy does not use them
        ("tools/kvf_main.c", '#include "kvf_proxy.h"', "from deploy/proxy"),
        ("deploy/proxy/kvf_proxy.c", '#include "kvf_cmds.h"', "from tools"),
        # kvf-proxy stands on the tokenizer and the ZeroMQ layer, never on the engine side
        ("deploy/proxy/kvf_proxy_openai.c", '#include "kvf_scheduler.h"',
         "from common/engine; deploy/proxy may use base, common/tokenizer, proto, transfer/zmq"),
        ("deploy/proxy/kvf_proxy_pool.c", '#include "kvf_side_channel.h"', "from transfer/channel"),
        # the tokenizer stands on base/ alone: not on the model config, not on the cache
        ("common/tokenizer/kvf_tok_load.c", '#include "kvf_model_config.h"',
         "from common/model; common/tokenizer may use base"),
        ("transfer/zmq/kvf_zmq.c", '#include "kvf_handshake.h"', "from transfer/wire"),
        ("transfer/plan/kvf_xfer_plan.c", '#include "kvf_side_channel.h"', "from transfer/channel"),
        ("common/model/kvf_shard.c", '#include "common/kvf_log.h"', "by path"),
    ]
    for rel, inc, why in cases:
        with tempfile.TemporaryDirectory() as tmp:
            for d in LAYER_DIRS:
                shutil.copytree(os.path.join(ROOT, d), os.path.join(tmp, d))
            line = plant(tmp, rel, inc)
            rc, out = run(tmp)
            assert rc == 1, f"planted {inc} in {rel} passed:\n{out}"
            want = f"{rel}:{line}:"
            hits = [l for l in out.splitlines() if l.startswith(want)]
            assert len(hits) == 1 and why in hits[0], \
                f"planted {inc} in {rel}: expected one line '{want} ... {why}', got:\n{out}"
            assert len(out.splitlines()) == 1, f"extra violations reported:\n{out}"
            print(f"ok: {hits[0]}")
    print(f"layering: tree clean, {len(cases)} planted includes caught")


if __name__ == "__main__":
    main()

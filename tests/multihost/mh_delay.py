#!/usr/bin/env python3
"""Delay every packet of one queue by a fixed time: a netem stand-in for
kernels without the netem qdisc.

    mh_delay.py QUEUE_NUM DELAY_MS

Run inside a test host (its network namespace); iptables rules there send
packets to NFQUEUE QUEUE_NUM (mh_net.TestNet.shape(delay_ms=...)). It binds
the queue over netlink (nfnetlink_queue), asks for packet metadata only (no
payload copy; GSO frames kept whole) and accepts each packet DELAY_MS after it
arrived, in order. Prints "ready" once bound. Exits on SIGTERM; the rules
use --queue-bypass, so packets pass undelayed once it is gone.
"""

import heapq
import os
import select
import signal
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG = 0, 1, 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN, NFQA_CFG_MASK, NFQA_CFG_FLAGS = 1, 2, 3, 4, 5
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NFQA_CFG_F_GSO = 4
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NF_ACCEPT = 1
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2


def attr(t, payload):
    a = struct.pack("=HH", 4 + len(payload), t) + payload
    return a + b"\0" * ((4 - len(a) % 4) % 4)


def msg(queue, mtype, attrs, flags=NLM_F_REQUEST, seq=0):
    body = struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(queue)) + b"".join(attrs)
    return struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | mtype, flags,
                       seq, 0) + body


def check_ack(sock):
    data = sock.recv(65536)
    ln, t = struct.unpack_from("=IH", data, 0)
    if t == NLMSG_ERROR:
        err = struct.unpack_from("=i", data, 16)[0]
        if err != 0:
            raise OSError(-err, "nfqueue config: %s" % os.strerror(-err))


def main():
    queue, delay = int(sys.argv[1]), float(sys.argv[2]) / 1000.0
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.bind((0, 0))
    cfg = [
        [attr(NFQA_CFG_CMD, struct.pack("!BBH", NFQNL_CFG_CMD_BIND, 0, socket.AF_INET))],
        [attr(NFQA_CFG_CMD, struct.pack("!BBH", NFQNL_CFG_CMD_BIND, 0, socket.AF_INET6))],
        [attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META)),
         attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", 65536)),
         attr(NFQA_CFG_MASK, struct.pack("!I", NFQA_CFG_F_GSO)),
         attr(NFQA_CFG_FLAGS, struct.pack("!I", NFQA_CFG_F_GSO))],
    ]
    for seq, attrs in enumerate(cfg, 1):
        sock.send(msg(queue, NFQNL_MSG_CONFIG, attrs, NLM_F_REQUEST | NLM_F_ACK, seq))
        try:
            check_ack(sock)
        except OSError as e:
            if not (seq == 2 and e.errno == 16):
                raise       # (a kernel binding every family at once: IPv6 is bound)
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    print("ready", flush=True)
    pending = []   # (release time, packet id)
    while True:
        timeout = max(0.0, pending[0][0] - time.monotonic()) if pending else 1.0
        r, _, _ = select.select([sock], [], [], timeout)
        if r:
            data = sock.recv(1 << 20)
            now = time.monotonic()
            off = 0
            while off + 16 <= len(data):
                ln, t = struct.unpack_from("=IH", data, off)
                if ln < 16:
                    break
                if t == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                    a = off + 20
                    while a + 4 <= off + ln:
                        alen, atype = struct.unpack_from("=HH", data, a)
                        if alen < 4:
                            break
                        if (atype & 0x7fff) == NFQA_PACKET_HDR:
                            pid = struct.unpack_from("!I", data, a + 4)[0]
                            heapq.heappush(pending, (now + delay, pid))
                        a += (alen + 3) & ~3
                off += (ln + 3) & ~3
        now = time.monotonic()
        while pending and pending[0][0] <= now:
            _, pid = heapq.heappop(pending)
            sock.send(msg(queue, NFQNL_MSG_VERDICT,
                          [attr(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, pid))]))


if __name__ == "__main__":
    main()

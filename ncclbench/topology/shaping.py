"""A network interface's egress shaping, read from the kernel over rtnetlink (no `tc`
binary, no library): the rate of a token-bucket (tbf) qdisc at the interface's root, the
cap `tc qdisc add dev eth0 root tbf rate 2gbit ...` puts on everything the host sends. A
NIC's link speed in sysfs does not show it; NCCL's traffic over that interface cannot go
faster. Unreadable (no netlink, another qdisc, a classful one): None, never a guess."""

from __future__ import annotations

import os
import socket
import struct

_NETLINK_ROUTE = 0
_RTM_NEWQDISC, _RTM_GETQDISC = 36, 38
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_TCA_KIND, _TCA_OPTIONS = 1, 2
_TCA_TBF_PARMS, _TCA_TBF_RATE64 = 1, 4
_TC_H_ROOT = 0xFFFFFFFF
_NLMSG = struct.Struct("=IHHII")     # length, type, flags, sequence, port
_TCMSG = struct.Struct("=BxxxiIII")  # family, ifindex, handle, parent, info
_RTATTR = struct.Struct("=HH")       # length, type
_RATESPEC_RATE = struct.Struct("=8xI")  # tc_ratespec: cell_log, linklayer, overhead, cell_align, mpu, rate (B/s)


def egress_rate_gbps(interface: str) -> float | None:
    """GB/s of the tbf qdisc at `interface`'s root in this process's network namespace;
    None when there is none or it cannot be read."""
    try:
        index = socket.if_nametoindex(interface)
        qdiscs = _dump_qdiscs()
    except (OSError, ValueError, AttributeError, struct.error):  # no such interface, no AF_NETLINK, a short reply
        return None
    for ifindex, parent, kind, options in qdiscs:
        if ifindex == index and parent == _TC_H_ROOT and kind == "tbf":
            rate = tbf_rate(options)
            return rate / 1e9 if rate else None
    return None


def tbf_rate(options: bytes) -> int | None:
    """Bytes per second of a tbf qdisc's TCA_OPTIONS (its 64-bit rate where the kernel gave one)."""
    attrs = dict(_attributes(options))
    if _TCA_TBF_RATE64 in attrs and len(attrs[_TCA_TBF_RATE64]) >= 8:
        return struct.unpack_from("=Q", attrs[_TCA_TBF_RATE64])[0]
    parms = attrs.get(_TCA_TBF_PARMS)
    if parms is None or len(parms) < _RATESPEC_RATE.size:
        return None
    return _RATESPEC_RATE.unpack_from(parms)[0] or None


def _attributes(data: bytes):
    """(type, payload) of each netlink attribute in `data`."""
    at = 0
    while at + _RTATTR.size <= len(data):
        length, kind = _RTATTR.unpack_from(data, at)
        if length < _RTATTR.size:
            return
        yield kind & 0x3FFF, data[at + _RTATTR.size: at + length]
        at += (length + 3) & ~3


def _dump_qdiscs() -> list[tuple[int, int, str, bytes]]:
    """(ifindex, parent, kind, options) of every qdisc the kernel lists."""
    out = []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_ROUTE) as sock:
        sock.settimeout(2.0)
        body = _TCMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
        seq = os.getpid() & 0xFFFF
        sock.send(_NLMSG.pack(_NLMSG.size + len(body), _RTM_GETQDISC, _NLM_F_REQUEST | _NLM_F_DUMP, seq, 0) + body)
        while True:
            data = sock.recv(1 << 16)
            at = 0
            while at + _NLMSG.size <= len(data):
                length, kind, _flags, _seq, _port = _NLMSG.unpack_from(data, at)
                if length < _NLMSG.size:
                    return out
                if kind == _NLMSG_DONE:
                    return out
                if kind == _NLMSG_ERROR:
                    raise OSError("netlink answered the qdisc dump with an error")
                if kind == _RTM_NEWQDISC:
                    payload = data[at + _NLMSG.size: at + length]
                    _family, ifindex, _handle, parent, _info = _TCMSG.unpack_from(payload)
                    attrs = dict(_attributes(payload[_TCMSG.size:]))
                    name = attrs.get(_TCA_KIND, b"").split(b"\0", 1)[0].decode(errors="replace")
                    out.append((ifindex, parent, name, attrs.get(_TCA_OPTIONS, b"")))
                at += (length + 3) & ~3
            if not data:
                return out

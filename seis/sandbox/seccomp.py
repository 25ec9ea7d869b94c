"""The seccomp filter every sandbox runs under (bwrap --seccomp): system calls a coding agent or a CUDA engine never
needs and that either keep state outside the sandbox or open a large kernel attack surface fail with EPERM.

- add_key, request_key, keyctl: the kernel keyrings outlive the sandbox and are shared by every sandbox that later
  gets the same uid (a channel from one sandbox to the next).
- bpf, perf_event_open, userfaultfd, io_uring_*: large kernel surfaces, the usual first step of a kernel exploit
  (io_uring requests are not even seen by seccomp).
- name_to_handle_at, open_by_handle_at: open a file by handle, bypassing the mount view (a classic container escape).
- module and kexec loading, reboot, swap, acct, quotactl, syslog, lookup_dcookie: host administration.
- personality: anything beyond Docker's harmless set (ADDR_NO_RANDOMIZE would switch ASLR off, READ_IMPLIES_EXEC
  make data executable).
- socket, socketpair: only the address families a network namespace confines (UNIX, IPv4, IPv6, netlink). Any other
  fails with EAFNOSUPPORT, as on a kernel without it: a vsock socket is in no network namespace (it reaches the VM
  host, CID 2, and the services listening there, and listens on ports of the whole machine), so a sandbox with no
  network held a channel out of it; the rest (packet, Bluetooth, ...) no agent or engine needs, and each loads a
  kernel module of its own on first use.
- ioctl, for fscrypt's calls (FS_IOC_ADD_ENCRYPTION_KEY and the rest): a filesystem with encryption enabled keeps
  the keys added to it in a keyring of its own, in no namespace, until it is unmounted, and any user may add one (a
  key of its choosing) and ask whether one is present. A sandbox that added keys left bits that a later sandbox,
  any uid, read back through a file of the same filesystem (a writable bind, the model, /usr). Setting a policy and
  the password salt (kept on disk) fail too: no agent or engine encrypts its files.
- sched_setaffinity, with fixed_cpus (engine sandboxes): a timed engine must stay on the CPU the gate gives it
  (seis.engine_host.affinity), and the call needs no privilege, so a candidate could widen its own threads' masks
  again and run its host side on many CPUs while vanilla gets one. The host pins the engine's threads from
  outside (unaffected: the filter holds only inside), and threads and processes created later inherit the mask.
  A library that binds its own threads (OpenMP's binding, NCCL's) gets EPERM and runs where it was put. Agent
  sandboxes keep the call.
Namespace creation (unshare, clone, setns) and mounting inside a user namespace stay allowed: an agent may run its
own nested sandbox (bwrap runs inside one). EPERM rather than a kill, so programs that probe degrade. The numbers
hold for x86-64 only: an x32 call fails with EPERM too, and a 32-bit one (int 0x80, another table) ends the process.
"""
from __future__ import annotations

import errno
import os
import platform
import struct

# x86-64 numbers, from /usr/include/x86_64-linux-gnu/asm/unistd_64.h (Linux UAPI; kernel
# arch/x86/entry/syscalls/syscall_64.tbl).
DENIED: dict[str, int] = {
    "add_key": 248, "request_key": 249, "keyctl": 250,
    "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "name_to_handle_at": 303, "open_by_handle_at": 304,
    "kexec_load": 246, "kexec_file_load": 320, "init_module": 175, "finit_module": 313, "delete_module": 176,
    "acct": 163, "swapon": 167, "swapoff": 168, "reboot": 169, "syslog": 103,
    "quotactl": 179, "quotactl_fd": 443, "lookup_dcookie": 212,
}
PERSONALITY = 135
SCHED_SETAFFINITY = 203   # denied only with fixed_cpus
SOCKET, SOCKETPAIR = 41, 53
IOCTL = 16
# fscrypt's ioctls (linux/fscrypt.h): the filesystem's keyring, and what an encryption policy leaves on disk. The kernel
# reads the request as an unsigned int, so these are compared with the low word of the argument.
DENIED_IOCTLS: dict[str, int] = {
    "FS_IOC_SET_ENCRYPTION_POLICY": 0x800C6613, "FS_IOC_GET_ENCRYPTION_PWSALT": 0x40106614,
    "FS_IOC_ADD_ENCRYPTION_KEY": 0xC0506617, "FS_IOC_REMOVE_ENCRYPTION_KEY": 0xC0406618,
    "FS_IOC_REMOVE_ENCRYPTION_KEY_ALL_USERS": 0xC0406619, "FS_IOC_GET_ENCRYPTION_KEY_STATUS": 0xC080661A,
}
# Address families (linux/socket.h) that a network namespace confines: AF_UNIX, AF_INET, AF_INET6, AF_NETLINK.
SOCKET_FAMILIES = (1, 2, 10, 16)
# personality(2) values Docker's default profile allows: PER_LINUX, PER_LINUX_32BIT, UNAME26, both, and the query.
PERSONAS = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)

AUDIT_ARCH_X86_64 = 0xC000003E       # EM_X86_64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE (linux/audit.h)
X32_SYSCALL_BIT = 0x40000000
# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6] (little-endian: args[0]'s low word)
NR_AT, ARCH_AT, ARG0_AT, ARG1_AT = 0, 4, 16, 24
# classic BPF (linux/bpf_common.h) and seccomp's verdicts (linux/seccomp.h)
LD_W_ABS, JEQ_K, JGE_K, RET_K = 0x20, 0x15, 0x35, 0x06
RET_ALLOW, RET_ERRNO, RET_KILL_PROCESS = 0x7FFF0000, 0x00050000, 0x80000000
RET_EPERM = RET_ERRNO | errno.EPERM
RET_EAFNOSUPPORT = RET_ERRNO | errno.EAFNOSUPPORT

Insn = tuple[int, int, int, int]     # struct sock_filter: code, jt, jf, k


def supported() -> bool:
    return platform.machine() == "x86_64"


def denied(fixed_cpus: bool = False) -> dict[str, int]:
    """The calls that fail with EPERM whatever their arguments: DENIED, and with fixed_cpus sched_setaffinity."""
    return {**DENIED, **({"sched_setaffinity": SCHED_SETAFFINITY} if fixed_cpus else {})}


def instructions(fixed_cpus: bool = False) -> list[Insn]:
    """The filter: wrong arch → kill; x32 or a denied number → EPERM; personality outside PERSONAS → EPERM; ioctl with
    a request in DENIED_IOCTLS → EPERM; socket or socketpair of a family outside SOCKET_FAMILIES → EAFNOSUPPORT; else
    allow. Jumps name their targets (the labels
    in the list, which classic BPF only jumps forward to), resolved to relative offsets below."""
    program: list[tuple[int, int | str, int | str, int] | str] = [
        (LD_W_ABS, 0, 0, ARCH_AT),
        (JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
        (RET_K, 0, 0, RET_KILL_PROCESS),
        (LD_W_ABS, 0, 0, NR_AT),
        (JGE_K, "eperm", 0, X32_SYSCALL_BIT),
        *[(JEQ_K, "eperm", 0, nr) for nr in sorted(denied(fixed_cpus).values())],
        (JEQ_K, "family", 0, SOCKET),
        (JEQ_K, "family", 0, SOCKETPAIR),
        (JEQ_K, "ioctl", 0, IOCTL),
        (JEQ_K, 0, "allow", PERSONALITY),
        (LD_W_ABS, 0, 0, ARG0_AT),   # the kernel takes personality's argument as an unsigned int
        *[(JEQ_K, "allow", 0, p) for p in PERSONAS],
        (RET_K, 0, 0, RET_EPERM),
        "family",
        (LD_W_ABS, 0, 0, ARG0_AT),   # the family, an int: its low word
        *[(JEQ_K, "allow", 0, f) for f in SOCKET_FAMILIES],
        (RET_K, 0, 0, RET_EAFNOSUPPORT),
        "ioctl",
        (LD_W_ABS, 0, 0, ARG1_AT),   # the request
        *[(JEQ_K, "eperm", 0, request) for request in DENIED_IOCTLS.values()],
        (RET_K, 0, 0, RET_ALLOW),
        "eperm",
        (RET_K, 0, 0, RET_EPERM),
        "allow",
        (RET_K, 0, 0, RET_ALLOW),
    ]
    labels: dict[str, int] = {}
    body: list[tuple[int, int | str, int | str, int]] = []
    for item in program:
        if isinstance(item, str):
            labels[item] = len(body)
        else:
            body.append(item)

    def offset(pc: int, to: int | str) -> int:
        return to if isinstance(to, int) else labels[to] - pc - 1

    return [(code, offset(pc, jt), offset(pc, jf), k) for pc, (code, jt, jf, k) in enumerate(body)]


def program(fixed_cpus: bool = False) -> bytes:
    """The filter as bwrap reads it: an array of struct sock_filter in native byte order (fixed_cpus: the sandbox
    cannot change its CPU affinity)."""
    return b"".join(struct.pack("=HBBI", *insn) for insn in instructions(fixed_cpus))


def program_fd(fixed_cpus: bool = False) -> int:
    """A descriptor holding program(fixed_cpus), read from its start, for `bwrap --seccomp FD` (the caller passes and
    closes it; MFD_CLOEXEC: only a child that is handed it through pass_fds gets it)."""
    fd = os.memfd_create("seis-seccomp", os.MFD_CLOEXEC)
    os.write(fd, program(fixed_cpus))
    os.lseek(fd, 0, os.SEEK_SET)
    return fd

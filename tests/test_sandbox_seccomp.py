"""The sandbox's seccomp filter: the program itself, checked by a small interpreter (no bubblewrap needed), then the
calls it denies tried from inside a real sandbox, where each must fail with EPERM while ordinary work goes on.

The calls inside are made with arguments the kernel itself would answer with success or another errno (EFAULT,
EINVAL, EBADF, ENOSYS) from an unprivileged process: EPERM there can only come from the filter.
"""
from __future__ import annotations

import errno
import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from seis.agents.llm.confine import AgentSandbox
from seis.engine_host.affinity import pinned_together
from seis.engine_host.policy import engine_policy, forbidden_paths
from seis.sandbox import SandboxedProcess, SandboxPolicy, SandboxUnavailable, allowed_env, bwrap, seccomp
from test_sandbox import run_probe


# --- the program, interpreted ---------------------------------------------------------------------------------------
def verdict(nr: int, arch: int = seccomp.AUDIT_ARCH_X86_64, arg0: int = 0, fixed_cpus: bool = False,
            arg1: int = 0) -> int:
    """What the filter returns for a call: runs the handful of classic-BPF instructions it is made of."""
    data = struct.pack("=IIQ6Q", nr, arch, 0, arg0, arg1, 0, 0, 0, 0)   # struct seccomp_data
    raw = seccomp.program(fixed_cpus)
    prog = [struct.unpack_from("=HBBI", raw, i) for i in range(0, len(raw), 8)]
    assert len(raw) % 8 == 0 and len(prog) <= 4096
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = prog[pc]
        if code == seccomp.LD_W_ABS:
            acc = struct.unpack_from("=I", data, k)[0]
        elif code in (seccomp.JEQ_K, seccomp.JGE_K):
            taken = acc == k if code == seccomp.JEQ_K else acc >= k
            pc += jt if taken else jf
        elif code == seccomp.RET_K:
            return k
        else:
            raise AssertionError(f"unexpected opcode {code:#x}")
        pc += 1


def test_the_program_denies_what_it_names_and_allows_the_rest() -> None:
    eperm = seccomp.RET_ERRNO | errno.EPERM
    assert {"add_key", "request_key", "keyctl", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup",
            "open_by_handle_at", "init_module", "kexec_load"} <= seccomp.DENIED.keys()
    for name, nr in seccomp.DENIED.items():
        assert verdict(nr) == eperm, name
    allowed = {"read": 0, "write": 1, "open": 2, "mmap": 9, "getpid": 39, "clone": 56, "execve": 59, "ptrace": 101,
               "unshare": 272, "setns": 308, "rseq": 334, "clone3": 435, "mount": 165}
    for name, nr in allowed.items():
        assert verdict(nr) == seccomp.RET_ALLOW, name
    assert verdict(0x40000000 | 39) == eperm and verdict(0xFFFFFFFF) == eperm   # x32 ABI, and beyond
    assert verdict(39, arch=0x40000003) == seccomp.RET_KILL_PROCESS               # i386 (int 0x80)
    assert verdict(248, arch=0xC00000B7) == seccomp.RET_KILL_PROCESS              # aarch64's numbering
    for persona in (0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF):
        assert verdict(135, arg0=persona) == seccomp.RET_ALLOW, hex(persona)
    for persona in (0x0040000, 0x0400000, 0x1):   # ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC, another ABI
        assert verdict(135, arg0=persona) == eperm, hex(persona)


def test_fixed_cpus_denies_sched_setaffinity_and_nothing_else() -> None:
    eperm = seccomp.RET_ERRNO | errno.EPERM
    assert verdict(203) == seccomp.RET_ALLOW and verdict(203, fixed_cpus=True) == eperm
    assert verdict(204, fixed_cpus=True) == seccomp.RET_ALLOW   # sched_getaffinity: reading the mask is fine
    for name, nr in seccomp.DENIED.items():
        assert verdict(nr, fixed_cpus=True) == eperm, name
    assert verdict(39, fixed_cpus=True) == seccomp.RET_ALLOW


def test_the_syscall_numbers_match_the_hosts_header() -> None:
    header = "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"
    try:
        text = open(header).read()
    except OSError:
        pytest.skip(f"no {header} here")
    for name, nr in {**seccomp.denied(fixed_cpus=True), "personality": seccomp.PERSONALITY, "socket": seccomp.SOCKET,
                     "socketpair": seccomp.SOCKETPAIR, "ioctl": seccomp.IOCTL}.items():
        assert f"#define __NR_{name} {nr}\n" in text, name


def test_every_sandbox_command_line_names_the_filter() -> None:
    argv = bwrap.command(SandboxPolicy(binds=(), env={}), ["true"], uid=None, info_fd=3, forbidden=(), seccomp_fd=7)
    assert argv[argv.index("--seccomp") + 1] == "7" and argv.index("--seccomp") < argv.index("--")


@pytest.mark.parametrize("host", ["aarch64", "a filter the kernel refuses"])
def test_no_sandbox_starts_where_the_filter_cannot_hold(monkeypatch, host: str) -> None:
    """Rather than a sandbox without the filter: SandboxUnavailable, with the reason."""
    if host == "aarch64":
        monkeypatch.setattr(seccomp, "supported", lambda: False)
    else:
        monkeypatch.setattr(seccomp, "program", lambda *_: b"\x06\x00\x00\x00")   # half an instruction
    bwrap.bwrap_version.cache_clear()
    try:
        with pytest.raises(SandboxUnavailable, match="seccomp"):
            bwrap.bwrap_version()
    finally:
        bwrap.bwrap_version.cache_clear()


# --- inside a sandbox -----------------------------------------------------------------------------------------------
def run_inside(code: str) -> dict:
    """Run Python `code` (printing one JSON object last) in a fresh sandbox with no binds; returns that object."""
    return run_probe(code, SandboxPolicy(binds=(), env=allowed_env()))


CALL = textwrap.dedent("""
    import ctypes, json, os
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    def call(nr, *args):
        ctypes.set_errno(0)
        r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
        return [r, ctypes.get_errno() if r == -1 else 0]
""")


def test_the_filter_is_installed_in_every_process() -> None:
    seen = run_inside("""
        import json, subprocess
        mode = lambda text: [l.split()[1] for l in text.splitlines() if l.startswith('Seccomp:')][0]
        child = subprocess.run(['/bin/sh', '-c', 'cat /proc/self/status'], capture_output=True, text=True).stdout
        print(json.dumps({'self': mode(open('/proc/self/status').read()), 'child': mode(child)}))
    """)
    assert seen == {"self": "2", "child": "2"}   # SECCOMP_MODE_FILTER, inherited by what it starts


def test_a_key_stashed_in_the_user_keyring_cannot_reach_a_later_sandbox() -> None:
    """Keyrings belong to the uid, and uids are reused from sandbox to sandbox: a key one leaves, the next could read
    (unfiltered, the second sandbox reads back the first one's secret)."""
    stash = run_inside(CALL + textwrap.dedent("""
        key = call(248, b"user", b"seis-stash", b"held-out prompt", 15, -4)   # add_key(..., KEY_SPEC_USER_KEYRING)
        if key[0] > 0:
            call(250, 15, key[0], 60)   # KEYCTL_SET_TIMEOUT: should the filter be missing, the key goes in a minute
        print(json.dumps({'add_key': key, 'session': call(248, b"user", b"seis", b"x", 1, -3)}))
    """))
    found = run_inside(CALL + textwrap.dedent("""
        key = call(250, 10, -4, b"user", b"seis-stash", 0)   # KEYCTL_SEARCH the user keyring
        data = ctypes.create_string_buffer(64)
        if key[0] > 0:
            call(250, 11, key[0], data, 64)                  # KEYCTL_READ
        print(json.dumps({'data': data.value.decode(), 'search': key, 'keyring': call(250, 0, -4, 0),
                          'request_key': call(249, b"user", b"seis-stash", None, 0)}))
    """))
    assert found["data"] == ""
    assert stash == {"add_key": [-1, errno.EPERM], "session": [-1, errno.EPERM]}
    assert found == {"data": "", "search": [-1, errno.EPERM], "keyring": [-1, errno.EPERM],
                     "request_key": [-1, errno.EPERM]}


def test_kernel_surfaces_an_agent_never_needs_are_denied() -> None:
    seen = run_inside(CALL + textwrap.dedent("""
        print(json.dumps({
            'io_uring_setup': call(425, 1, None),           # EFAULT unfiltered
            'io_uring_enter': call(426, -1, 0, 0, 0, None, 0),   # EBADF
            'bpf': call(321, 0xFFFF, None, 0),               # EINVAL
            'perf_event_open': call(298, None, 0, -1, -1, 0),    # EFAULT
            'userfaultfd': call(323, 1),                    # UFFD_USER_MODE_ONLY: a descriptor unfiltered
            'open_by_handle_at': call(304, 1000, None, 0),  # EFAULT
            'name_to_handle_at': call(303, 1000, b"x", None, None, 0),   # EBADF
            'x32 getpid': call(0x40000000 | 39),            # ENOSYS (or a pid) unfiltered
            'personality(ADDR_NO_RANDOMIZE)': call(135, 0x0040000),
        }))
    """))
    assert seen == {name: [-1, errno.EPERM] for name in seen}


def test_a_32_bit_system_call_kills_the_process() -> None:
    """int 0x80 reaches the i386 table, where the numbers above mean other calls: the filter ends the process."""
    seen = run_inside("""
        import json, subprocess, sys, textwrap
        code = textwrap.dedent('''
            import ctypes, mmap
            page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
            page.write(bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3]))   # mov eax, 20 (i386 getpid); int 0x80; ret
            print(ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))())
        ''')
        done = subprocess.run([sys.executable, '-c', code], capture_output=True)
        print(json.dumps({'rc': done.returncode, 'out': done.stdout.decode()}))
    """)
    assert seen["rc"] == -signal.SIGSYS, seen


AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, AF_PACKET, AF_BLUETOOTH, AF_VSOCK, AF_QIPCRTR = 1, 2, 10, 16, 17, 31, 40, 42


def test_no_socket_family_that_a_network_namespace_does_not_confine_can_be_opened() -> None:
    """A sandbox's network is its namespace: loopback only. A vsock socket is in no network namespace: it reaches the
    VM host (CID 2) and the services listening there, and listens on ports of the whole machine, so a sandbox with no
    network held a channel out of it (unfiltered, the probe opens one and listens on a vsock port). Only the families
    a namespace confines open: UNIX, IPv4, IPv6, netlink; any other fails as on a kernel without it."""
    eafnosupport = seccomp.RET_ERRNO | errno.EAFNOSUPPORT
    for nr in (41, 53):   # socket, socketpair
        for family in (AF_UNIX, AF_INET, AF_INET6, AF_NETLINK):
            assert verdict(nr, arg0=family) == seccomp.RET_ALLOW, (nr, family)
        for family in (0, AF_PACKET, AF_BLUETOOTH, AF_VSOCK, AF_QIPCRTR, 45, 0xFFFF):
            assert verdict(nr, arg0=family) == eafnosupport, (nr, family)
    assert verdict(41, arg0=(1 << 32) | AF_VSOCK) == eafnosupport   # the kernel reads the family as an int
    seen = run_inside("""
        import errno, json, socket
        out = {}
        try:
            s = socket.socket(40, socket.SOCK_STREAM)       # AF_VSOCK
            s.bind((0xFFFFFFFF, 0))                          # VMADDR_CID_ANY, any port: nothing is contacted
            s.listen(1)
            out['vsock'] = 'listening'
            s.close()
        except OSError as e:
            out['vsock'] = errno.errorcode.get(e.errno, str(e.errno))
        for name, family in (('unix', socket.AF_UNIX), ('inet', socket.AF_INET), ('inet6', socket.AF_INET6)):
            try:
                socket.socket(family, socket.SOCK_STREAM).close()
                out[name] = 'ok'
            except OSError as e:
                out[name] = errno.errorcode.get(e.errno, str(e.errno))
        a, b = socket.socketpair()
        a.sendall(b'x')
        out['socketpair'] = b.recv(1).decode()
        print(json.dumps(out))
    """)
    assert seen == {"vsock": "EAFNOSUPPORT", "unix": "ok", "inet": "ok", "inet6": "ok", "socketpair": "x"}, seen


def test_ordinary_work_goes_on_under_the_filter() -> None:
    seen = run_inside(CALL + textwrap.dedent("""
        import subprocess, threading
        open('/tmp/f', 'w').write('x' * 100)
        threads = [threading.Thread(target=lambda: None) for _ in range(8)]
        for t in threads: t.start()
        for t in threads: t.join()
        sh = subprocess.run(['/bin/sh', '-c', 'echo hi'], capture_output=True, text=True).stdout
        cc = subprocess.run(['gcc', '-v'], capture_output=True, text=True).returncode
        print(json.dumps({'read': len(open('/tmp/f').read()), 'sh': sh, 'gcc': cc,
                          'personality query': call(135, 0xFFFFFFFF)[1]}))
    """))
    assert seen == {"read": 100, "sh": "hi\n", "gcc": 0, "personality query": 0}


# The widening a timed engine would try once the gate has pinned it: itself, a thread it starts, a child it starts.
WIDEN = """
    import json, os, subprocess, sys, threading
    everywhere = set(EVERYWHERE)
    def widen():
        try:
            os.sched_setaffinity(0, everywhere)
            return 'widened'
        except PermissionError:
            return 'EPERM'
    print('ready', flush=True)
    sys.stdin.readline()   # the host pins every thread of the sandbox meanwhile, from outside
    seen = {'self': widen()}
    thread = {}
    t = threading.Thread(target=lambda: thread.update(tried=widen(), mask=sorted(os.sched_getaffinity(0))))
    t.start(); t.join()
    child = subprocess.run([sys.executable, '-c', 'import os\\ntry:\\n os.sched_setaffinity(0, ' + repr(everywhere)
                            + ')\\n r = "widened"\\nexcept PermissionError:\\n r = "EPERM"\\n'
                            'print(r, sorted(os.sched_getaffinity(0)))'], capture_output=True, text=True)
    seen.update(mask=sorted(os.sched_getaffinity(0)), thread=thread, child=child.stdout.strip().split(maxsplit=1))
    print(json.dumps(seen), flush=True)
"""


def pinned_then_widening(policy: SandboxPolicy) -> tuple[int, dict]:
    """Start WIDEN in a sandbox of `policy`, pin it from the host to one CPU as the gate pins a timed engine, let it
    try to widen its mask again; returns the CPU and what it saw."""
    everywhere = sorted(os.sched_getaffinity(0))
    if len(everywhere) < 2:
        pytest.skip("one CPU: a pinned mask cannot be told from an unpinned one")
    code = textwrap.dedent(WIDEN).replace("EVERYWHERE", repr(everywhere))
    box = SandboxedProcess([sys.executable, "-c", code], policy, forbidden=forbidden_paths(), stderr=subprocess.PIPE)
    proc = box.start()
    try:
        assert proc.stdout.readline() == b"ready\n", proc.stderr.read().decode()[-2000:]
        with pinned_together(box.members) as cpu:
            assert cpu is not None
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
            out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err.decode()[-2000:]
        return cpu, json.loads(out.decode().strip().splitlines()[-1])
    finally:
        box.kill()


def test_an_engine_sandbox_cannot_widen_the_cpu_mask_the_host_pinned_it_to(tmp_path: Path) -> None:
    """The gate times engines with every thread pinned to one shared CPU, from outside. sched_setaffinity needs no
    privilege: unfiltered, a candidate widened its mask again and ran its host side on every CPU while vanilla had
    one. In an engine sandbox the call fails; the pin holds for the process, its threads and its children."""
    (tmp_path / "engine").mkdir()
    (tmp_path / "model").mkdir()
    policy = engine_policy(tmp_path / "engine", tmp_path / "model", "cpu")
    assert policy.fixed_cpus
    cpu, seen = pinned_then_widening(policy)
    assert seen == {"self": "EPERM", "mask": [cpu], "thread": {"tried": "EPERM", "mask": [cpu]},
                    "child": ["EPERM", f"[{cpu}]"]}


def test_an_agent_sandbox_may_still_set_its_cpu_mask(tmp_path: Path) -> None:
    """Only engines are timed: an agent's own tools (taskset, a build's job binding) keep the call."""
    policy = AgentSandbox().policy(tmp_path)
    assert not policy.fixed_cpus
    cpu, seen = pinned_then_widening(policy)
    everywhere = sorted(os.sched_getaffinity(0))
    assert seen == {"self": "widened", "mask": everywhere, "thread": {"tried": "widened", "mask": everywhere},
                    "child": ["widened", str(everywhere)]}


# --- fscrypt: a keyring per filesystem, in no namespace ---------------------------------------------------------------
FS_IOC_ADD_ENCRYPTION_KEY, FS_IOC_GET_ENCRYPTION_KEY_STATUS = 0xC0506617, 0xC080661A
TCGETS, FIONREAD = 0x5401, 0x541B


def test_the_program_denies_fscrypts_ioctls_and_no_other() -> None:
    eperm = seccomp.RET_ERRNO | errno.EPERM
    for name, request in seccomp.DENIED_IOCTLS.items():
        assert verdict(seccomp.IOCTL, arg1=request) == eperm, name
        assert verdict(seccomp.IOCTL, arg1=(1 << 32) | request) == eperm, name   # the kernel reads an unsigned int
    for request in (TCGETS, FIONREAD, 0xC0186403, 0x46):   # a terminal, a pipe, DRM, nvidia's control calls
        assert verdict(seccomp.IOCTL, arg1=request) == seccomp.RET_ALLOW, hex(request)
    assert verdict(seccomp.IOCTL, arg0=FS_IOC_ADD_ENCRYPTION_KEY) == seccomp.RET_ALLOW   # the descriptor, not the call


@pytest.fixture
def encrypting_fs(tmp_path: Path):
    """A directory on a small ext4 filesystem with encryption enabled (loop-mounted; root only)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a filesystem needs root")
    image, mnt = tmp_path / "fs.img", tmp_path / "mnt"
    mnt.mkdir()
    with open(image, "wb") as f:
        f.truncate(64 * 2**20)
    made = subprocess.run(["mkfs.ext4", "-q", "-O", "encrypt", str(image)], capture_output=True)
    if made.returncode != 0 or subprocess.run(["mount", "-o", "loop", str(image), str(mnt)],
                                              capture_output=True).returncode != 0:
        pytest.skip("no loop-mounted ext4 with encryption here")
    try:
        (mnt / "shared").mkdir()
        yield mnt / "shared"
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


FSCRYPT = textwrap.dedent("""
    import fcntl, json, os, struct, sys
    fd = os.open('/fs', os.O_RDONLY | os.O_DIRECTORY)
    def add(raw):   # struct fscrypt_add_key_arg: a key specifier by identifier (v2), then the raw key
        arg = bytearray(struct.pack('=II32sII32s', 2, 0, bytes(32), len(raw), 0, bytes(32)) + raw)
        try:
            fcntl.ioctl(fd, %d, arg)
            return bytes(arg[8:24]).hex()
        except OSError as e:
            return e.errno
    def status(identifier):   # struct fscrypt_get_key_status_arg; status 2 is FSCRYPT_KEY_STATUS_PRESENT
        arg = bytearray(struct.pack('=II16s16s', 2, 0, bytes.fromhex(identifier), bytes(16)) + bytes(88))
        try:
            fcntl.ioctl(fd, %d, arg)
            return struct.unpack_from('=I', arg, 64)[0]
        except OSError as e:
            return -e.errno
""" % (FS_IOC_ADD_ENCRYPTION_KEY, FS_IOC_GET_ENCRYPTION_KEY_STATUS))


def test_a_key_added_to_a_filesystems_keyring_cannot_reach_a_later_sandbox(encrypting_fs: Path) -> None:
    """fscrypt keeps the keys added to a filesystem in a keyring of that filesystem's, until it is unmounted, and
    any user may add one and ask whether a key is present. A sandbox that saw held-out prompts could add keys whose
    identifiers spell them; a later sandbox, with a file of the same filesystem (here a read-only bind), asked for
    them back (unfiltered: the second sandbox finds the first one's key present)."""
    from seis.sandbox import Bind
    # the identifier fscrypt derives from this key (HKDF-SHA512), so the reader need not be told it
    key = bytes([7]) * 64
    expected = "79b2a2affd74816ff0fcf332cacf22ee"
    writer = run_probe(FSCRYPT + f"print(json.dumps({{'added': add({key!r})}}))",
                       SandboxPolicy(binds=(Bind(encrypting_fs, "/fs", writable=True),), env=allowed_env()))
    reader = run_probe(FSCRYPT + f"print(json.dumps({{'status': status({expected!r})}}))",
                       SandboxPolicy(binds=(Bind(encrypting_fs, "/fs"),), env=allowed_env()))
    assert reader["status"] != 2, (writer, reader)
    assert writer == {"added": errno.EPERM} and reader == {"status": -errno.EPERM}

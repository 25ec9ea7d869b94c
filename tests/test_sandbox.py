"""The sandbox's boundaries, each tried from inside by a hostile process; every attempt must fail.

Each test runs a small Python probe in a real sandbox (bubblewrap) and reads back what it managed to do.
"""
from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import seis.evaluator
from seis.engine_host.policy import PROJECT_ROOT, engine_policy, forbidden_paths
from seis.engine_import import ENGINE_TEMPLATE
from seis.sandbox import Bind, Limits, SandboxedProcess, SandboxError, SandboxPolicy, allowed_env, frozen


def run_probe(code: str, policy: SandboxPolicy | None = None, timeout: float = 60) -> dict:
    """Run `code` (which prints one JSON object last) in a sandbox; returns that object."""
    policy = policy or SandboxPolicy(binds=(Bind(ENGINE_TEMPLATE, "/engine"),), env=allowed_env())
    box = SandboxedProcess([sys.executable, "-c", textwrap.dedent(code)], policy, forbidden=forbidden_paths(),
                           stderr=subprocess.PIPE)
    proc = box.start()
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        box.kill()
    assert proc.returncode == 0, err.decode()[-2000:]
    return json.loads(out.decode().strip().splitlines()[-1])


def test_runs_as_an_unprivileged_user_without_capabilities() -> None:
    seen = run_probe("""
        import json, os
        status = dict(line.split(':', 1) for line in open('/proc/self/status'))
        print(json.dumps({'uid': os.getuid(), 'euid': os.geteuid(), 'caps': status['CapEff'].strip(),
                          'bnd': status['CapBnd'].strip(), 'nnp': status['NoNewPrivs'].strip()}))
    """)
    assert seen["uid"] != 0 and seen["euid"] != 0
    assert int(seen["caps"], 16) == 0 and int(seen["bnd"], 16) == 0 and seen["nnp"] == "1"


def test_what_must_not_be_seen_is_not_mounted(tmp_path: Path) -> None:
    secret_dir = Path(seis.evaluator.__file__).resolve().parent
    heldout = PROJECT_ROOT / "data" / "prepared"
    seen = run_probe(f"""
        import json, os, subprocess
        paths = {[str(PROJECT_ROOT), str(secret_dir), str(heldout), str(PROJECT_ROOT / '.git'),
                  str(Path.home()), '/work', '/root/.cache', '/run', '/var', '/home', str(tmp_path)]!r}
        visible = [p for p in paths if os.path.exists(p)]
        # the classic ways around a hiding mount: unmount it, or reach the host's root through /proc
        um = subprocess.run(['umount', '-l', '/usr'], capture_output=True).returncode
        try:
            os.listdir('/proc/1/root/')
            via_proc = True
        except OSError:
            via_proc = False
        print(json.dumps({{'visible': visible, 'umount_rc': um, 'via_proc': via_proc,
                          'root': sorted(os.listdir('/'))}}))
    """)
    # A home directory shows up only as the parent of the Python installation when Python lives there
    # (e.g. pyenv under /root), never with its contents: ~/.cache is absent above.
    assert set(seen["visible"]) <= {str(Path.home())} and str(Path.home()) not in (str(PROJECT_ROOT), "/work")
    assert seen["umount_rc"] != 0 and not seen["via_proc"]
    assert set(seen["root"]) <= {"bin", "dev", "engine", "etc", "lib", "lib32", "lib64", "libx32", "proc", "root",
                                 "sbin", "sys", "tmp", "usr", "opt"}


def test_checkout_and_own_tree_cannot_be_written(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "x.py").write_text("pass\n")
    policy = SandboxPolicy(binds=(Bind(tree, "/engine"),), env=allowed_env())
    seen = run_probe(f"""
        import json
        results = {{}}
        for path in ['/engine/x.py', '/engine/new.py', {str(PROJECT_ROOT / 'README.md')!r}, '/usr/evil', '/etc/evil']:
            try:
                open(path, 'a').write('evil')
                results[path] = 'written'
            except OSError as e:
                results[path] = type(e).__name__
        print(json.dumps(results))
    """, policy)
    assert "written" not in seen.values(), seen
    assert (tree / "x.py").read_text() == "pass\n" and not (tree / "new.py").exists()


def test_environment_is_allow_listed(monkeypatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-SECRET")
    monkeypatch.setenv("https_proxy", "http://proxy.invalid")
    monkeypatch.setenv("SEIS_TEST_PRIVATE", "x")
    seen = run_probe("""
        import json, os
        print(json.dumps({'env': dict(os.environ), 'init': open('/proc/1/environ', 'rb').read().decode()
                          if os.access('/proc/1/environ', os.R_OK) else ''}))
    """, SandboxPolicy(binds=(), env=allowed_env()))
    text = json.dumps(seen)
    assert "SECRET" not in text and "proxy.invalid" not in text and "SEIS_TEST_PRIVATE" not in text
    assert seen["env"]["HF_HUB_OFFLINE"] == "1"


def test_only_allow_listed_names_pass_and_no_key_value_under_them(monkeypatch) -> None:
    """Device and library settings pass by exact name: no family of names (NVIDIA_*, NCCL_*, OMP_*, LC_*) lets a
    key through under a name no list of key words foresees, and no kept setting may hold a key's value."""
    hidden = {"NVIDIA_API_KEY": "nvapi-test-hidden-1", "NVIDIA_APIKEY": "nvapi-test-hidden-2",
              "NCCL_AUTH_TOKEN": "nccl-test-hidden-3", "NCCL_IB_PASSWD": "nccl-test-hidden-4",
              "OMP_AUTH": "omp-test-hidden-5", "LC_PASSWORD": "lc-test-hidden-6", "NVSHMEM_BOOTSTRAP": "hidden-7",
              "CUDA_DEVICE_SERVICE_URL": "https://hidden-8.invalid", "TORCH_SYMM_X": "hidden-9",
              "OPENAI_API_KEY": "sk-test-hidden-10-abcdefgh",
              "OMP_NUM_THREADS": "sk-test-hidden-10-abcdefgh"}         # a key's value under a kept name
    for name, value in hidden.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "all")                 # device settings still pass
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    seen = run_probe("""
        import json, os
        print(json.dumps(dict(os.environ)))
    """, SandboxPolicy(binds=(), env=allowed_env()))
    assert "hidden" not in json.dumps(seen), seen
    assert seen["NVIDIA_VISIBLE_DEVICES"] == "all" and seen["LC_ALL"] == "C.UTF-8"


def test_packages_on_the_operators_pythonpath_import_inside_but_the_checkout_stays_out(tmp_path: Path,
                                                                                    monkeypatch) -> None:
    # `pip install --target DIR` + PYTHONPATH=DIR is how an optional kernel library (FlashInfer) may be installed;
    # an engine must import it as the host does, or E0's `auto` falls back to another backend without a word.
    site = tmp_path / "site"
    site.mkdir()
    (site / "seis_probe_pkg.py").write_text("VALUE = 42\n")
    # world-writable on the host: only the sandbox's read-only mount stands between a hostile engine and them
    site.chmod(0o777)
    (site / "seis_probe_pkg.py").chmod(0o666)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(PROJECT_ROOT), str(site), str(tmp_path / "absent")]))
    seen = run_probe("""
        import json, os, sys
        import seis_probe_pkg
        try:
            import seis.evaluator
            evaluator = seis.evaluator.__file__
        except ImportError:
            evaluator = None
        # a hostile engine plants a module where the host's own processes import from, or edits one there
        planted = []
        for target in (os.path.join(%r, 'sitecustomize.py'), seis_probe_pkg.__file__):
            try:
                with open(target, 'a') as f:
                    f.write('import os\\n')
                planted.append(target)
            except OSError:
                pass
        print(json.dumps({'value': seis_probe_pkg.VALUE, 'pythonpath': os.environ.get('PYTHONPATH'),
                          'evaluator': evaluator, 'checkout': os.path.exists(%r), 'planted': planted}))
    """ % (str(site), str(PROJECT_ROOT)))
    assert seen["value"] == 42 and seen["pythonpath"] == str(site)
    assert seen["evaluator"] is None and not seen["checkout"]
    assert seen["planted"] == [] and sorted(p.name for p in site.iterdir()) == ["seis_probe_pkg.py"]
    assert (site / "seis_probe_pkg.py").read_text() == "VALUE = 42\n"


def test_credential_files_beside_a_shown_python_installation_cannot_be_read(tmp_path: Path, monkeypatch) -> None:
    """The sandbox shows a Python installation's root whole: a pip.conf or .condarc there (a private package index's
    token) was readable by every agent and engine; now it cannot be read inside, and the packages beside it still
    import."""
    site = tmp_path / "site"
    (site / "etc").mkdir(parents=True)
    (site / "seis_probe_pkg.py").write_text("VALUE = 42\n")
    token = "https://seis:tok-3f9a8c1d@index.example/simple"
    for conf in (site / "pip.conf", site / ".condarc", site / "etc" / "pip.conf"):
        conf.write_text(f"[global]\nindex-url = {token}\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    seen = run_probe("""
        import json, os
        import seis_probe_pkg
        read = {}
        for name in ('pip.conf', '.condarc', 'etc/pip.conf'):
            try:
                read[name] = open(os.path.join(%r, name)).read()
            except OSError as e:
                read[name] = 'unreadable: ' + str(e)
        print(json.dumps({'value': seis_probe_pkg.VALUE, 'read': read}))
    """ % str(site))
    assert seen["value"] == 42
    # /dev/null bound over each (on a nodev mount: opening it fails), like the install records that name the checkout
    assert all(text.startswith("unreadable: [Errno 13]") for text in seen["read"].values()), seen["read"]
    assert token in (site / "pip.conf").read_text()  # the host's file is untouched


def test_a_home_directory_on_the_operators_path_variables_is_never_shown(tmp_path: Path, monkeypatch) -> None:
    """PYTHONPATH, LD_LIBRARY_PATH and CPATH entries are shown whole: one naming the operator's home (or a
    directory above it) showed every file in it, the API key exported in ~/.bashrc and the Hugging Face token
    included. A home is never shown; a package directory inside one still imports."""
    home = tmp_path / "home"
    site = home / ".local" / "site"
    site.mkdir(parents=True)
    (home / ".cache" / "huggingface").mkdir(parents=True)
    (site / "seis_probe_pkg.py").write_text("VALUE = 42\n")
    (home / ".bashrc").write_text("export OPENAI_API_KEY=sk-seis-probe-home-secret\n")
    (home / ".cache" / "huggingface" / "token").write_text("hf_seis_probe_home_secret\n")
    for d in (tmp_path, home, home / ".local", site, home / ".cache", home / ".cache" / "huggingface"):
        d.chmod(0o755)  # a home others may read, as Debian makes them (and the owner's own, in a rootless run)
    for f in (site / "seis_probe_pkg.py", home / ".bashrc", home / ".cache" / "huggingface" / "token"):
        f.chmod(0o644)
    # SEIS's cache elsewhere (a large disk, as on GPU hosts): the home is not above a forbidden path
    monkeypatch.setenv("SEIS_CACHE", str(tmp_path.parent / "seis-probe-cache"))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), str(home)]))
    monkeypatch.setenv("LD_LIBRARY_PATH", str(home))
    monkeypatch.setenv("CPATH", str(tmp_path))  # above the home
    seen = run_probe("""
        import json, os
        import seis_probe_pkg
        read = {}
        for path in (%r, %r, %r):
            try:
                read[path] = open(path).read()
            except OSError as e:
                read[path] = 'unreadable: ' + type(e).__name__
        print(json.dumps({'value': seis_probe_pkg.VALUE, 'read': read}))
    """ % (str(home / ".bashrc"), str(home / ".cache" / "huggingface" / "token"),
           str(tmp_path / "home" / ".bashrc")))
    assert seen["value"] == 42
    assert "secret" not in json.dumps(seen["read"]), seen["read"]


def test_path_inside_holds_the_interpreters_tools_and_shown_operator_entries_only(tmp_path: Path,
                                                                                  monkeypatch) -> None:
    # FlashInfer's JIT calls `ninja` (a venv's bin) and `nvcc` by PATH: the operator's entries that the sandbox
    # shows stay on PATH; one it does not show, or the checkout's, does not.
    site, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    for d in (site / "bin", elsewhere / "bin"):
        d.mkdir(parents=True)
        for made in (d.parent, d):  # as an operator's install would be, whatever the umask of this test run
            made.chmod(0o755)
        tool = d / "seis-probe-tool"
        tool.write_text(f"#!/bin/sh\necho {d.parent.name}\n")
        tool.chmod(0o755)
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.setenv("PATH", os.pathsep.join([str(PROJECT_ROOT / "scripts"), str(elsewhere / "bin"),
                                                str(site / "bin"), os.environ["PATH"]]))
    seen = run_probe("""
        import json, os, shutil, subprocess, sys
        tool = shutil.which('seis-probe-tool')
        print(json.dumps({'path': os.environ['PATH'].split(':'), 'interpreter_dir': os.path.dirname(sys.executable),
                          'tool': tool, 'says': subprocess.run([tool], capture_output=True, text=True).stdout.strip()
                          if tool else None}))
    """)
    assert seen["interpreter_dir"] in seen["path"] and str(site / "bin") in seen["path"]
    assert str(elsewhere / "bin") not in seen["path"] and str(PROJECT_ROOT / "scripts") not in seen["path"]
    assert seen["says"] == "site"


def test_the_system_view_is_reachable_whatever_the_callers_umask(tmp_path: Path) -> None:
    # Under umask 077, directories bwrap makes on its own come out 0700: /etc would hide the loader cache and
    # /etc/alternatives (where /usr/local/cuda points), so nvcc could not run. The sandbox does not depend on it.
    old = os.umask(0o077)
    try:
        seen = run_probe("""
            import json, os, stat
            print(json.dumps({p: stat.S_IMODE(os.stat(p).st_mode) for p in ('/', '/etc', '/tmp', '/tmp/home')}
                             | {'cache': os.access('/etc/ld.so.cache', os.R_OK)}))
        """)
    finally:
        os.umask(old)
    assert seen["cache"] is True
    assert seen["/etc"] == 0o755 and seen["/"] & 0o005 == 0o005 and seen["/tmp/home"] == 0o1777


def test_a_read_only_tree_written_under_umask_077_is_readable_inside(tmp_path: Path) -> None:
    # A stored engine tree written under umask 077 is 0700/0600 root's: shown read-only, the sandbox's own user
    # must still read it (and run what is executable), and still must not write it.
    old = os.umask(0o077)
    try:
        tree = tmp_path / "tree"
        (tree / "engine").mkdir(parents=True)
        (tree / "engine" / "model.py").write_text("WEIGHTS = 1\n")
        tool = tree / "run.sh"
        tool.write_text("#!/bin/sh\necho ran\n")
        tool.chmod(0o700)
        seen = run_probe("""
            import json, subprocess
            text = open('/engine/engine/model.py').read()
            ran = subprocess.run(['/engine/run.sh'], capture_output=True, text=True).stdout.strip()
            try:
                open('/engine/engine/model.py', 'a').write('x')
                wrote = True
            except OSError:
                wrote = False
            print(json.dumps({'text': text, 'ran': ran, 'wrote': wrote}))
        """, SandboxPolicy(binds=(Bind(tree, "/engine"),), env=allowed_env()))
    finally:
        os.umask(old)
    assert seen == {"text": "WEIGHTS = 1\n", "ran": "ran", "wrote": False}
    assert (tree / "engine" / "model.py").read_text() == "WEIGHTS = 1\n"


def test_links_in_a_read_only_tree_do_not_widen_what_they_point_to(tmp_path: Path) -> None:
    # A hostile tree may carry links to private host files, hoping the host's widening of read-only binds
    # follows them: the files linked to keep their modes, and inside they do not exist.
    secret_dir = tmp_path / "private"
    secret_dir.mkdir(mode=0o700)
    secret = secret_dir / "key"
    secret.write_text("sk-canary\n")
    secret.chmod(0o600)
    tree = tmp_path / "tree"
    (tree / "engine").mkdir(parents=True)
    (tree / "engine" / "key").symlink_to(secret)
    (tree / "engine" / "private").symlink_to(secret_dir)
    seen = run_probe("""
        import json
        def read(p):
            try:
                return open(p).read()
            except OSError as e:
                return type(e).__name__
        print(json.dumps({'file': read('/engine/engine/key'), 'dir': read('/engine/engine/private/key')}))
    """, SandboxPolicy(binds=(Bind(tree, "/engine"),), env=allowed_env()))
    assert "sk-canary" not in json.dumps(seen)
    assert secret.stat().st_mode & 0o777 == 0o600 and secret_dir.stat().st_mode & 0o777 == 0o700


def test_no_network_and_no_host_sockets(tmp_path: Path) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    unix_path = Path("/tmp") / f"seis-test-{os.getpid()}.sock"
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(unix_path))
    unix.listen()
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind(f"\0seis-test-{os.getpid()}")
    abstract.listen()
    try:
        seen = run_probe(f"""
            import json, socket
            out = {{}}
            for name, family, addr in [('tcp', socket.AF_INET, ('127.0.0.1', {port})),
                                       ('dns', socket.AF_INET, ('1.1.1.1', 53)),
                                       ('unix', socket.AF_UNIX, {str(unix_path)!r}),
                                       ('abstract', socket.AF_UNIX, '\\0seis-test-{os.getpid()}')]:
                s = socket.socket(family)
                s.settimeout(3)
                try:
                    s.connect(addr)
                    out[name] = 'connected'
                except OSError as e:
                    out[name] = type(e).__name__
            print(json.dumps(out))
        """)
    finally:
        server.close()
        unix.close()
        abstract.close()
        unix_path.unlink(missing_ok=True)
    assert "connected" not in seen.values(), seen


def test_siblings_cannot_be_signalled_and_can_be_frozen() -> None:
    policy = SandboxPolicy(binds=(), env=allowed_env())
    victim = SandboxedProcess([sys.executable, "-c", "import time\nwhile True:\n    print(time.time(), flush=True)\n"
                               "    time.sleep(0.05)"], policy)
    victim.start()
    try:
        host_pids = victim.members()
        seen = run_probe(f"""
            import json, os, signal
            hits = []
            for pid in {host_pids!r} + list(range(1, 400)):
                if pid == os.getpid():
                    continue
                try:
                    os.kill(pid, signal.SIGSTOP)
                    hits.append(pid)
                except OSError:
                    pass
            try:  # the evaluator itself: an interrupt it did not get would end its gates with no verdict
                os.kill({os.getpid()}, 0)
                evaluator = True
            except OSError:
                evaluator = False
            print(json.dumps({{'hits': hits, 'own': os.getpid(), 'evaluator': evaluator}}))
        """, policy)
        # Only its own namespace's processes are addressable (itself and its children), never the sibling's, and
        # never the evaluator (its pid is a host pid, which no process of the sandbox's namespace has).
        assert not set(seen["hits"]) & set(host_pids)
        assert seen["evaluator"] is False
        line = victim.proc.stdout.readline()
        assert line, "the sibling stopped answering"
        # The gate, though, can freeze a sandbox as a whole and let it go again.
        with frozen([victim]):  # returns once every process of it has stopped
            states = {open(f"/proc/{p}/stat").read().split()[2] for p in victim.members()}
            assert states == {"T"}
        assert {open(f"/proc/{p}/stat").read().split()[2] for p in victim.members()} != {"T"}
    finally:
        victim.kill()


def test_freeze_stops_what_runs_in_namespaces_the_sandbox_made() -> None:
    """A process of the sandbox moves a spinner into a user and PID namespace of its own: freezing the sandbox
    stops that spinner too, so nothing of a frozen engine runs beside the one being timed."""
    marker = f"seis-nested-{random.randrange(10**9)}"
    box = SandboxedProcess(["bash", "-c", f"unshare --user --pid --fork sh -c 'while :; do :; done; {marker}' & "
                                          f"sh -c 'while :; do :; done; {marker}' & wait"],
                           SandboxPolicy(binds=(), env=allowed_env()))
    box.start()
    try:
        deadline = time.monotonic() + 10
        while len(spinners := [p for p in _marked(marker) if Path(f"/proc/{p}/cmdline").read_bytes().startswith(
                b"sh\0-c\0while")]) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(spinners) == 2, "both spinners run"
        namespaces = {os.readlink(f"/proc/{p}/ns/pid") for p in spinners}
        assert len(namespaces) == 2, "one spinner is in a PID namespace of its own, below the sandbox's"
        with frozen([box]):
            time.sleep(0.2)
            assert {open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0] for p in spinners} == {"T"}
            assert set(spinners) <= set(box.members())
    finally:
        box.kill()
    assert not _marked(marker)


# A process that has the kernel resume it: a POSIX timer whose signal is SIGCONT, then a spin. SIGCONT is handled
# (recent kernels park a timer whose signal is ignored, as SIGCONT's default is once it resumed nothing), and a
# thread arms the timer again every 10 ms for 500 ms ahead, so while the process runs the timer never fires: a
# SIGSTOP that finds a SIGCONT of the timer pending drops it and parks the timer until the next arming. Once the
# freeze stops the arming, the timer fires 500 ms later, after the freeze however late it comes (a freeze that
# itself takes longer catches the wake, and that round tells nothing). The handler writes "w" to stdout: the
# test's own witness that the process ran, beside what thaw() reads from /proc. With arm=False the same program
# never arms its timer and must stay stopped.
SELF_WAKING = textwrap.dedent("""
    import ctypes, os, signal, threading, time
    libc = ctypes.CDLL(None, use_errno=True)
    class Event(ctypes.Structure):
        _fields_ = [("value", ctypes.c_void_p), ("signo", ctypes.c_int), ("notify", ctypes.c_int),
                    ("pad", ctypes.c_byte * 48)]
    class Spec(ctypes.Structure):
        _fields_ = [("interval", ctypes.c_long * 2), ("value", ctypes.c_long * 2)]
    signal.signal(signal.SIGCONT, lambda *_: os.write(1, b"w"))
    event, timer = Event(signo=signal.SIGCONT, notify=0), ctypes.c_void_p()  # SIGEV_SIGNAL
    assert libc.timer_create(1, ctypes.byref(event), ctypes.byref(timer)) == 0
    every = (ctypes.c_long * 2)(0, 500_000_000)
    def arm():
        while True:
            libc.timer_settime(timer, 0, ctypes.byref(Spec(every, every)), None)
            time.sleep(0.01)
    if {arm}:
        threading.Thread(target=arm, daemon=True).start()
    os.write(1, b"armed")
    while True:
        pass
    """)


def _drain(fd: int) -> bytes:
    """What the pipe holds now, without waiting."""
    got = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            return got
        if not chunk:
            return got
        got += chunk


@pytest.mark.parametrize("wakes", [False, True])
def test_a_sandbox_that_runs_while_frozen_is_told_when_it_is_thawed(wakes: bool) -> None:
    """SIGSTOP is not a freeze the sandbox cannot undo: the kernel resumes a stopped process when a signal it
    arranged itself is SIGCONT (a POSIX timer's, a file's F_SETSIG, a child's exit signal), with nothing of the
    sandbox left running to send it. Such a process ran beside the engine being timed (it could slow it down)
    while freeze() had seen it stopped. thaw() says whether any process of the sandbox ran since freeze(), and
    says it exactly when the process's own witness shows it ran; a spinner that stays stopped did not."""
    box = SandboxedProcess(["python3", "-c", SELF_WAKING.format(arm=wakes)],
                           SandboxPolicy(binds=(), env=allowed_env()))
    fd = box.start().stdout.fileno()
    try:
        assert os.read(fd, 5) == b"armed"
        os.set_blocking(fd, False)
        told, witnessed = [], []
        for _ in range(3):  # a timer that fires while freeze() is still at work is caught by it, and parked
            box.freeze()
            _drain(fd)  # a wake that freeze() caught, or the last round's thaw
            time.sleep(1.2)
            witnessed.append(b"w" in _drain(fd))
            told.append(box.thaw())
            if wakes and witnessed[-1]:
                break
            time.sleep(0.3)  # resumed, the process arms its timer again before the next freeze
        assert told == witnessed, (told, witnessed)
        assert any(witnessed) == wakes, witnessed
    finally:
        box.kill()


def _marked(marker: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{name}/cmdline").read_bytes():
                    found.append(int(name))
            except OSError:
                pass
    return found


def test_nothing_outlives_the_sandbox() -> None:
    marker = f"seis-survivor-{os.getpid()}"
    code = f"""
        import os, signal, subprocess, time
        # double fork + setsid + ignored signals: the usual way to escape a process-group kill
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                signal.signal(signal.SIGHUP, signal.SIG_IGN)
                os.execv('/bin/sh', ['/bin/sh', '-c', 'exec -a {marker} sleep 300'])
            os._exit(0)
        subprocess.Popen(['nohup', 'sh', '-c', 'exec -a {marker} sleep 300'], start_new_session=True)
        time.sleep(300)
    """
    box = SandboxedProcess([sys.executable, "-c", textwrap.dedent(code)], SandboxPolicy(binds=(), env=allowed_env()))
    box.start()
    deadline = time.monotonic() + 20
    while len(_marked(marker)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(_marked(marker)) >= 2, "the probe did not start its survivors"
    box.kill()
    assert _marked(marker) == [] and box.members() == []


def test_what_one_sandbox_leaves_in_ipc_tmp_or_shm_is_gone_for_the_next_of_its_uid() -> None:
    """Uids are reused from sandbox to sandbox. SysV segments, queues and semaphores and POSIX queues outlive their
    process and are keyed by a number anyone may guess, /tmp and /dev/shm by a name: each must die with its
    sandbox (its own IPC namespace and RAM-backed mounts), or a candidate that saw held-out prompts hands them to
    the next sandbox of its uid, an agent's included."""
    leave = """
        import ctypes, json, os
        libc = ctypes.CDLL(None, use_errno=True)
        made = {'shm': libc.shmget(0x5e15, 4096, 0o1666), 'msg': libc.msgget(0x5e15, 0o1666),
                'sem': libc.semget(0x5e15, 1, 0o1666), 'mq': libc.mq_open(b'/seis-left', 0o102, 0o666, None)}
        for d in ('/tmp', '/dev/shm'):
            open(d + '/seis-left', 'w').write('held-out')
        print(json.dumps({'uid': os.getuid(), **made}))
    """
    find = """
        import ctypes, json, os
        libc = ctypes.CDLL(None, use_errno=True)
        print(json.dumps({'uid': os.getuid(), 'shm': libc.shmget(0x5e15, 0, 0), 'msg': libc.msgget(0x5e15, 0),
                          'sem': libc.semget(0x5e15, 0, 0), 'mq': libc.mq_open(b'/seis-left', 2),
                          'files': [d for d in ('/tmp', '/dev/shm') if os.path.exists(d + '/seis-left')]}))
    """
    left = run_probe(leave)
    assert min(left[k] for k in ("shm", "msg", "sem", "mq")) >= 0, left  # each was made
    found = run_probe(find)  # as root, most often the same uid (the lowest free one); the keys need none
    assert found == {"uid": found["uid"], "shm": -1, "msg": -1, "sem": -1, "mq": -1, "files": []}


def test_an_owner_killed_while_its_sandboxes_start_leaves_nothing_after_the_sweep(tmp_path: Path) -> None:
    """A run's process killed (SIGKILL) while bwrap starts can leave the sandbox's init waiting for ever for a
    launcher that is gone (seen in CI: a root bwrap with no parent and no child). The run's cleanup sweeps such
    leftovers; so does the next sandbox that leases the same uid."""
    owner = textwrap.dedent("""
        import sys, threading, time
        from pathlib import Path
        from seis.sandbox import Bind, SandboxedProcess, SandboxPolicy, allowed_env
        mark = Path(sys.argv[1]); mark.mkdir()
        policy = SandboxPolicy(binds=(Bind(mark, "/m"),), env=allowed_env())
        def churn():
            while True:
                # the marker on the command line (bwrap's binds are not: it reads them from a descriptor)
                box = SandboxedProcess(["/bin/sh", "-c", "sleep 60", str(mark)], policy)
                box.start(); time.sleep(0.02); box.kill()
        for _ in range(4):
            threading.Thread(target=churn, daemon=True).start()
        time.sleep(60)
    """)
    from seis.sandbox import sweep_leftovers
    # a live sandbox is no leftover: the sweep must not touch it (started first, so its uid is not a leftover's)
    live = SandboxedProcess(["/bin/sleep", "120"], SandboxPolicy(binds=(), env=allowed_env()))
    live.start()
    try:
        deadline = time.monotonic() + 10
        while len(members := live.members()) < 2 and time.monotonic() < deadline:  # bwrap's init and sleep
            time.sleep(0.05)
        rng = random.Random(7)
        for attempt in range(40):  # a few per cent of kills land in bwrap's start-up window; stop at the first
            marker = str(tmp_path / f"owner-{attempt}")
            proc = subprocess.Popen([sys.executable, "-c", owner, marker])
            time.sleep(rng.uniform(1.0, 2.5))
            proc.kill()
            proc.wait()
            time.sleep(0.5)  # the launchers' die-with-parent
            if _marked(marker):
                time.sleep(2.0)  # on a loaded host a launcher can be slow to die with its parent: no leftover yet
                if left := _marked(marker):
                    break
        assert left, "no kill left a sandbox process behind: the case under test did not happen"
        assert sweep_leftovers() >= 1
        deadline = time.monotonic() + 5
        while _marked(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _marked(marker) == []
        assert live.alive() and live.members() == members
    finally:
        live.kill()


def test_limits_apply_inside() -> None:
    policy = SandboxPolicy(binds=(), env=allowed_env(), limits=Limits(max_processes=300, memory_bytes=3 * 2**30,
                                                                       max_file_bytes=2**20))
    seen = run_probe("""
        import json, resource
        print(json.dumps({'nproc': resource.getrlimit(resource.RLIMIT_NPROC)[0],
                          'as': resource.getrlimit(resource.RLIMIT_AS)[0],
                          'fsize': resource.getrlimit(resource.RLIMIT_FSIZE)[0]}))
    """, policy)
    assert seen == {"nproc": 300, "as": 3 * 2**30, "fsize": 2**20}


def test_the_oom_killer_takes_a_sandbox_first_and_it_cannot_change_that() -> None:
    """Every sandboxed process goes before the host's (the orchestrator, its API keys in memory) when the host runs
    out of memory; lowering that from inside is refused."""
    seen = run_probe("""
        import json
        adj = open('/proc/self/oom_score_adj').read().strip()
        try:
            with open('/proc/self/oom_score_adj', 'w') as f:
                f.write('-1000')
            lowered = open('/proc/self/oom_score_adj').read().strip()
        except OSError as e:
            lowered = type(e).__name__
        print(json.dumps({'adj': adj, 'lowered': lowered}))
    """)
    assert seen == {"adj": "1000", "lowered": "PermissionError"}
    assert open("/proc/self/oom_score_adj").read().strip() != "1000"  # the host's own processes keep theirs


def test_without_a_memory_cgroup_the_watch_stops_a_sandbox_past_its_bound(monkeypatch) -> None:
    """A host that lets SEIS make no memory cgroup (the GPU hosts): two processes, each within its RLIMIT_AS, hold
    more than the sandbox's bound together; the memory watch kills the sandbox and says so."""
    import seis.sandbox.process as process
    monkeypatch.setattr(process.MemoryCage, "create", classmethod(lambda cls, name, limit: None))
    policy = SandboxPolicy(binds=(), env=allowed_env(), limits=Limits(sandbox_memory_bytes=700 * 2**20))
    hog = ("import os, time\n"
           "os.fork()\n"                                   # two processes, 500 MiB each, touched
           "x = bytearray(500 * 2**20); x[::4096] = b'a' * len(x[::4096])\n"
           "time.sleep(20)\nprint('SURVIVED', flush=True)\n")
    box = SandboxedProcess([sys.executable, "-c", hog], policy, stderr=subprocess.DEVNULL)
    t0 = time.monotonic()
    proc = box.start()
    try:
        out, _ = proc.communicate(timeout=30)
    finally:
        box.kill()
    assert box.cage is None and b"SURVIVED" not in out and time.monotonic() - t0 < 15
    assert "past the sandbox's bound of 0.7 GiB: the watch killed it" in (box.memory_bound_reached() or "")


def test_without_a_memory_cgroup_memory_no_process_maps_is_caught_by_the_hosts_floor(monkeypatch) -> None:
    """The same host: memory written into a memfd and never mapped is no process's (PSS does not see it, nor does
    RLIMIT_AS), so the watch also reads the host's available memory. Here the floor sits 512 MiB under what the
    host has now, and the sandbox keeps taking memory that way, 64 MiB at a time up to 6 GiB (what other processes
    free meanwhile cannot keep it above the floor): it is killed, and the note says why. It takes it at about
    0.4 GB/s, so that by the watch's once-a-second look it has taken little past the floor: at 1.3 GB/s it once
    ended in a full run with no note from the watch (the likely cause, not confirmed: the kernel's OOM killer
    first, on a host the other tests had left short)."""
    import seis.sandbox.memory_watch as memory_watch
    import seis.sandbox.process as process
    monkeypatch.setattr(process.MemoryCage, "create", classmethod(lambda cls, name, limit: None))
    floor = memory_watch.host_available_bytes() - 512 * 2**20
    monkeypatch.setattr(memory_watch, "memory_floor_bytes", lambda: floor)
    monkeypatch.setattr(memory_watch, "FLOOR_DROP_MARGIN", 256 * 2**20)
    policy = SandboxPolicy(binds=(), env=allowed_env(), limits=Limits(sandbox_memory_bytes=64 * 2**30))
    hog = ("import os, time\n"
           "fd = os.memfd_create('hidden')\n"
           "for _ in range(96):\n"
           "    os.write(fd, b'\\1' * 2**26)\n"
           "    time.sleep(0.15)\n"
           "time.sleep(15)\nprint('SURVIVED', flush=True)\n")
    box = SandboxedProcess([sys.executable, "-c", hog], policy, stderr=subprocess.DEVNULL)
    proc = box.start()
    try:
        out, _ = proc.communicate(timeout=45)
    finally:
        box.kill()
    assert b"SURVIVED" not in out
    assert "the host's available memory fell under" in (box.memory_bound_reached() or "")


def test_engine_sees_its_tree_and_model_read_only(tmp_path: Path) -> None:
    from seis.models import resolve_model
    model = resolve_model("tiny-qwen3")
    policy = engine_policy(ENGINE_TEMPLATE, model, "cpu")
    seen = run_probe("""
        import json, os
        out = {'engine': os.path.isfile('/engine/engine/__init__.py'), 'model': os.path.isfile('/model/config.json'),
               'worker': sorted(os.listdir('/seis-host'))}
        try:
            open('/model/config.json', 'a').write('x')
            out['model_write'] = True
        except OSError:
            out['model_write'] = False
        print(json.dumps(out))
    """, policy)
    assert seen == {"engine": True, "model": True, "worker": ["engine_import.py", "worker.py"], "model_write": False}


def _thread_states(box: SandboxedProcess) -> dict[int, set[str]]:
    """Per member of the sandbox, the states of all of its threads, read from /proc here (not by the code under
    test)."""
    return {p: {open(f"/proc/{p}/task/{t}/stat").read().rsplit(")", 1)[1].split()[0]
                for t in os.listdir(f"/proc/{p}/task")} for p in box.members()}


def _states(box: SandboxedProcess) -> set[str]:
    return set().union(*_thread_states(box).values())


def test_processes_that_resume_each_other_stay_frozen_or_the_freeze_says_they_resisted() -> None:
    """Processes of a sandbox that SIGCONT each other without pause: one not yet stopped resumes one that is, so
    stopping each of them once left one in five freezes with a process running while another engine was timed.
    A freeze returns only with every process stopped, or raises: on a host with a core for each of them (16-core
    GPU hosts), a SIGCONT can keep discarding the SIGSTOP sent meanwhile, and the gate kills and fails an engine
    whose freeze raised. Never does it return with one of them running."""
    code = textwrap.dedent("""
        import os, signal
        known = [os.getpid()]      # each process resumes all it knows: its parent and older siblings; the parent all
        for _ in range(3):
            child = os.fork()
            if child == 0:
                break
            known.append(child)
        else:
            print("ready", flush=True)
        me = os.getpid()
        while True:
            for pid in known:
                if pid != me:
                    try:
                        os.kill(pid, signal.SIGCONT)
                    except ProcessLookupError:
                        pass
    """)
    box = SandboxedProcess([sys.executable, "-c", code], SandboxPolicy(binds=(), env=allowed_env()))
    box.start()
    try:
        assert box.proc.stdout.readline().strip() == b"ready"
        for _ in range(20):
            try:
                box.freeze(timeout_s=1)
            except SandboxError as e:
                assert "did not stay stopped" in str(e)
            else:
                assert _states(box) == {"T"}
                time.sleep(0.05)   # nothing of it may have resumed meanwhile
                assert _states(box) == {"T"}
            box.thaw()
            time.sleep(0.02)
            assert _states(box) != {"T"}
        # Given no time to win, the freeze says the sandbox resisted instead of returning with processes running.
        with pytest.raises(SandboxError, match="did not stay stopped"):
            box.freeze(timeout_s=0)
    finally:
        box.kill()


def test_a_process_whose_first_thread_ended_is_frozen_too() -> None:
    """A thread group's first thread can end (SYS_exit) while the others run on: /proc then shows the process as a
    zombie. Its running thread must still count as a member and be stopped."""
    code = textwrap.dedent("""
        import ctypes, threading, time
        def spin():
            while True:
                pass
        threading.Thread(target=spin).start()
        print("ready", flush=True)
        time.sleep(0.2)
        ctypes.CDLL(None).syscall(60, 0)   # SYS_exit: the calling (first) thread only
    """)
    box = SandboxedProcess([sys.executable, "-c", code], SandboxPolicy(binds=(), env=allowed_env()))
    box.start()
    try:
        assert box.proc.stdout.readline().strip() == b"ready"
        time.sleep(0.5)
        threads = _thread_states(box)
        assert any({"Z", "R"} <= s for s in threads.values()), threads   # the spinning thread is found
        box.freeze()
        time.sleep(0.1)
        assert _states(box) <= {"T", "Z"}, _thread_states(box)
    finally:
        box.kill()
    assert box.members() == []


def test_sandbox_kill_is_prompt_even_when_frozen() -> None:
    box = SandboxedProcess(["sleep", "300"], SandboxPolicy(binds=(), env=allowed_env()))
    box.start()
    box.freeze()
    t0 = time.monotonic()
    box.kill()
    assert box.members() == [] and time.monotonic() - t0 < 5


def test_engine_replies_must_answer_the_current_request(tmp_path: Path) -> None:
    """A reply written ahead (or twice) answers no request: the next call is an engine error, not a result, and the
    engine, which broke the protocol, is killed."""
    from seis.engine_host import EngineError, EngineProcess
    from seis.models import resolve_model
    from tests.evaluator_helpers import after_each_reply, copy_engine
    tree = after_each_reply(copy_engine(tmp_path / "twice"), "_sent(out, **payload)")  # every reply sent twice
    with EngineProcess(tree, resolve_model("tiny-qwen3"), {"device": "cpu", "max_seq_len": 64}, timeout_s=60) as eng:
        eng.build()
        # found waiting before the request is sent, or read as its reply: either way no result
        with pytest.raises(EngineError, match="does not answer the current|reply stream before 'stats'"):
            eng.stats()
        assert eng.pids() == []


def test_a_second_kill_never_reaches_the_sandbox_that_took_over_its_uid_or_pids() -> None:
    """kill() runs once: called again after its sandbox is gone, it must not signal by the uid, pids or namespace
    that were its own, for another sandbox may hold them by then (here the next sandbox gets the freed uid)."""
    policy = SandboxPolicy(binds=(), env=allowed_env())
    first = SandboxedProcess(["/bin/sleep", "120"], policy)
    first.start()
    first.kill()
    assert first.members() == []
    second = SandboxedProcess(["/bin/sleep", "120"], policy)
    second.start()
    try:
        if os.geteuid() == 0:
            assert second.uid == first.uid  # the freed uid is leased again: the case under test
        deadline = time.monotonic() + 10
        while len(members := second.members()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        first.kill()
        time.sleep(0.5)
        assert second.alive() and second.members() == members
    finally:
        second.kill()

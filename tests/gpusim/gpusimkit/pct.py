"""`pct`: Proxmox VE's container CLI, a thin shim over LXC's tools on the simulator's containers
(gpusimkit.container: real LXC containers under the lxcpath DIR/lxc).

``start`` is ``lxc-start``, ``status`` ``lxc-info``, ``exec`` ``lxc-attach --keep-env|--clear-env`` (the
process becomes lxc-attach, as pve-container's ``exec``), ``shutdown`` ``lxc-stop [--nokill] --timeout N``,
``stop`` ``lxc-stop --kill``; ``list`` and ``config`` read the configs in DIR/etc/pve/nodes/<node>/lxc (PVE's
``/etc/pve/nodes/<node>/lxc/<vmid>.conf``, the files the modules read too).  Each invocation first spends what a real
pct spends starting (``startup_cost``).  Not simulated: storage, snapshots, the cluster.

Output formats, messages and exit codes follow pve-container's ``PVE::CLI::pct`` and
pve-common's ``PVE::CLIHandler`` / ``PVE::JSONSchema::get_options`` (see the notes, section C):

- parameter errors: ``400 <message>`` (+ ``<param>: <error>`` lines) + the command's short usage
  on stderr, exit 255;
- an unknown vmid: ``Configuration file 'nodes/<node>/lxc/<vmid>.conf' does not exist``, exit 2
  (Perl's ``die`` with ``$!`` = ENOENT);
- any other failure: the message on stderr, exit 255;
- ``pct exec`` exits with the command's exit status.

Installed in a scenario as ``DIR/bin/pct``: a script that calls ``main(sys.argv[1:], simdir=DIR)``.
"""

from __future__ import annotations

import os
import re
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

from . import container

EXE = "pct"
# What a real pct costs before it does anything: Perl compiling PVE::CLI::pct and the PVE libraries it loads
# (PVE::LXC, PVE::Storage, PVE::Cluster, the API2 classes), at each start. No public measurement was found: the figure
# is ASSUMED (README "What pct costs"), the low end of "several hundred milliseconds", and `make pve-smoke`
# (tools/pve_smoke.py) records the real one on a Proxmox VE node. GPUSIM_PCT_STARTUP_S overrides it (0: a test of
# the shim's formats, which does not measure cost).
STARTUP_S = 0.3
STARTUP_ENV = "GPUSIM_PCT_STARTUP_S"
# Every invocation appends a line (pid, then its arguments, space-separated) to DIR/CALLS_LOG, so that a benchmark
# or a test can count the pct processes a method started (``calls(simdir)``). Not a real node's: ASSUMED, ours.
CALLS_LOG = "pct-calls.log"


def startup_cost() -> float:
    """Seconds each pct invocation spends starting: $GPUSIM_PCT_STARTUP_S, else STARTUP_S."""
    try:
        return max(0.0, float(os.environ.get(STARTUP_ENV, STARTUP_S)))
    except ValueError:
        return STARTUP_S


# command -> (positional parameters, {option: type}); types: boolean, integer, string
COMMANDS: Dict[str, Tuple[List[str], Dict[str, str]]] = {
    "config": (["vmid"], {"current": "boolean", "snapshot": "string"}),
    "exec": (["vmid", "extra-args"], {"keep-env": "boolean"}),
    "help": (["extra-args"], {"verbose": "boolean"}),
    "list": ([], {}),
    "shutdown": (["vmid"], {"forceStop": "boolean", "timeout": "integer"}),
    "start": (["vmid"], {"debug": "boolean", "skiplock": "boolean"}),
    "status": (["vmid"], {"verbose": "boolean"}),
    "stop": (["vmid"], {"overrule-shutdown": "boolean", "skiplock": "boolean"}),
}
MINIMUM = {"timeout": 0}


class ParamError(Exception):
    """PVE::Exception with code 400 (printed with the command's usage)."""

    def __init__(self, msg: str, errors: Optional[Dict[str, str]] = None):
        super().__init__(msg)
        self.msg = msg
        self.errors = errors or {}


class Die(Exception):
    """A plain Perl `die`: message on stderr, exit code as Perl computes it."""

    def __init__(self, msg: str, code: int = 255):
        super().__init__(msg)
        self.msg = msg
        self.code = code


def usage_short(cmd: str) -> str:
    args, opts = COMMANDS[cmd]
    parts = [f"{EXE} {cmd}"]
    for a in args:
        parts.append("[<extra-args>]" if a == "extra-args" else f"<{a}>")
    if opts:
        parts.append("[OPTIONS]")
    return " ".join(parts)


def print_usage_short(out, msg: Optional[str] = None) -> None:
    if msg:
        out.write(f"ERROR: {msg}\n")
    out.write(f"USAGE: {EXE} <COMMAND> [ARGS] [OPTIONS]\n\n")
    for cmd in sorted(COMMANDS):
        out.write("       " + usage_short(cmd) + "\n")
    out.write("\n")


def _expand(cmd: str) -> Optional[str]:
    if cmd in COMMANDS:
        return cmd
    matches = [c for c in COMMANDS if c.startswith(cmd)]
    return matches[0] if len(matches) == 1 else None


def parse_boolean(v: str) -> Optional[int]:
    lv = v.lower()
    if lv in ("1", "on", "yes", "true"):
        return 1
    if lv in ("0", "off", "no", "false"):
        return 0
    return None


def get_options(cmd: str, args: Sequence[str]) -> Dict[str, object]:
    """Getopt::Long (prefix - or --, abbreviations, case-insensitive, permute, `--` ends options)
    and then the positional parameters, as PVE::JSONSchema::get_options does."""
    arg_param, spec = COMMANDS[cmd]
    opts: Dict[str, object] = {}
    pos: List[str] = []
    i = 0
    args = [str(a) for a in args]
    while i < len(args):
        a = args[i]
        if a == "--":
            pos.extend(args[i + 1:])
            break
        if a.startswith("-") and a != "-":
            body = a[2:] if a.startswith("--") else a[1:]
            name, eq, val = body.partition("=")
            exact = [k for k in spec if k.lower() == name.lower()]
            matches = exact or [k for k in spec if k.lower().startswith(name.lower())]
            if len(matches) != 1:
                if matches:
                    sys.stderr.write(f"Option {name} is ambiguous ({', '.join(sorted(matches))})\n")
                else:
                    sys.stderr.write(f"Unknown option: {name.lower()}\n")
                raise ParamError("unable to parse option")
            key = matches[0]
            if spec[key] == "boolean":  # "key:s": an optional value
                if eq:
                    value = val
                elif i + 1 < len(args) and not args[i + 1].startswith("-"):
                    i += 1
                    value = args[i]
                else:
                    value = ""
            else:  # "key=s": a mandatory value
                if eq:
                    value = val
                elif i + 1 < len(args):
                    i += 1
                    value = args[i]
                else:
                    sys.stderr.write(f"Option {key} requires an argument\n")
                    raise ParamError("unable to parse option")
            opts[key] = value
        else:
            pos.append(a)
        i += 1

    for name in arg_param:
        if name == "extra-args":
            opts["extra-args"] = pos
            pos = []
            break
        if not pos:
            raise ParamError("not enough arguments")
        opts[name] = pos.pop(0)
    if pos:
        raise ParamError("too many arguments")

    for key, kind in spec.items():
        if key in opts and kind == "boolean":
            b = 1 if opts[key] == "" else parse_boolean(str(opts[key]))
            if b is None:
                raise ParamError("unable to parse boolean option")
            opts[key] = b

    # schema validation (PVE::JSONSchema::validate -> raise_param_exc)
    errors: Dict[str, str] = {}
    if "vmid" in opts and not re.fullmatch(r"[1-9][0-9]{2,8}", str(opts["vmid"])):
        errors["vmid"] = "invalid format - value does not look like a valid VM ID"
    for key, kind in spec.items():
        if key in opts and kind == "integer":
            if not re.fullmatch(r"-?[0-9]+", str(opts[key])):
                errors[key] = f"type check ('integer') failed - got '{opts[key]}'"
            elif key in MINIMUM and int(str(opts[key])) < MINIMUM[key]:
                errors[key] = f"value must have a minimum value of {MINIMUM[key]}"
            else:
                opts[key] = int(str(opts[key]))
    if errors:
        raise ParamError("Parameter verification failed.", errors)
    return opts


# --- commands ------------------------------------------------------------------------------------

def _vmid(simdir: str, opts) -> int:
    v = int(str(opts["vmid"]))
    if not container.exists(simdir, v):
        # load_config dies after a failed open: Perl's exit code is $! (ENOENT = 2).
        raise Die(f"Configuration file 'nodes/{container.nodename()}/lxc/{v}.conf' does not exist", 2)
    return v


def cmd_list(simdir: str, opts) -> int:
    rows = []
    for v in container.list(simdir):
        try:
            keys = container.read_config(simdir, v)[0]
            st = container.status(simdir, v)
        except container.ContainerError:
            continue
        # PVE::LXC::vmstatus: the name is the hostname, else "CT<vmid>", without whitespace.
        name = re.sub(r"\s", "", keys.get("hostname") or f"CT{v}")
        rows.append((str(v), st, keys.get("lock", ""), name))
    if not rows:
        return 0  # no containers: nothing at all, not even the header
    fmt = "%-10s %-10s %-12s %-20s\n"
    sys.stdout.write(fmt % ("VMID", "Status", "Lock", "Name"))
    for r in rows:
        sys.stdout.write(fmt % r)
    return 0


def cmd_status(simdir: str, opts) -> int:
    v = _vmid(simdir, opts)
    st = container.status(simdir, v)
    if not opts.get("verbose"):
        sys.stdout.write(f"status: {st}\n")
        return 0
    keys = container.read_config(simdir, v)[0]
    mib = 1024 * 1024
    stat: Dict[str, object] = {
        "cpu": 0,
        "cpus": keys.get("cores", "1"),
        "disk": 0,
        "diskread": 0,
        "diskwrite": 0,
        "maxdisk": 32 * 1024 * mib,
        "maxmem": int(keys.get("memory", "512")) * mib,
        "maxswap": int(keys.get("swap", "0")) * mib,
        "mem": 0,
        "name": re.sub(r"\s", "", keys.get("hostname") or f"CT{v}"),
        "netin": 0,
        "netout": 0,
        "status": st,
        "swap": 0,
        "type": "lxc",
        "uptime": container.uptime(simdir, v),
        "vmid": v,
    }
    m = re.search(r"size=(\d+)G", keys.get("rootfs", ""))
    if m:
        stat["maxdisk"] = int(m.group(1)) * 1024 * mib
    if "lock" in keys:
        stat["lock"] = keys["lock"]
    ip = container.init_pid(simdir, v)
    if ip:
        stat["pid"] = ip[0]
    for k in sorted(stat):
        sys.stdout.write(f"{k}: {stat[k]}\n")
    return 0


def cmd_start(simdir: str, opts) -> int:
    v = _vmid(simdir, opts)
    if container.status(simdir, v) == "running":
        raise Die(f"CT {v} already running")
    container.start(simdir, v)
    return 0


def exec_env() -> Dict[str, str]:
    """The environment lxc-attach is started with: ours, less what pve-container's clean_environment
    drops (SSL_CERT_FILE, SSL_CERT_DIR)."""
    env = dict(os.environ)
    env.pop("SSL_CERT_FILE", None)
    env.pop("SSL_CERT_DIR", None)
    return env


def cmd_exec(simdir: str, opts) -> int:
    v = _vmid(simdir, opts)
    if container.status(simdir, v) != "running":
        raise Die(f"container '{v}' not running!")
    argv = opts.get("extra-args") or []
    if not argv:
        raise Die("missing command")
    keep_env = bool(opts.get("keep-env", 1))
    env = container.command_env(simdir, v, exec_env())
    set_vars = None
    if not keep_env:
        # lxc-attach --clear-env: PATH and container=lxc; the simulated driver installed in the container
        # (nvidia-smi in DIR/ctbin, the library in DIR/lib) stays reachable.
        set_vars = {"PATH": f"{env['PATH'].split(':')[0]}:{container.DEFAULT_PATH}", "GPUSIM_VMID": str(v)}
        for k in ("GPUSIM_DIR", "LD_LIBRARY_PATH"):
            if k in env:
                set_vars[k] = env[k]
    sys.stdout.flush()
    sys.stderr.flush()
    cmd = container.attach_argv(simdir, v, argv, keep_env=keep_env, set_vars=set_vars)
    try:
        os.execvpe(cmd[0], cmd, env)  # as pve-container's exec: the process becomes lxc-attach
    except OSError as e:
        raise Die(f"exec {cmd[0]} failed: {e.strerror}") from None
    return 255


def cmd_shutdown(simdir: str, opts) -> int:
    v = _vmid(simdir, opts)
    if container.status(simdir, v) != "running":
        raise Die(f"CT {v} not running")
    container.shutdown(simdir, v, timeout=opts.get("timeout", 60), force_stop=bool(opts.get("forceStop", 0)))
    return 0


def cmd_stop(simdir: str, opts) -> int:
    v = _vmid(simdir, opts)
    if container.status(simdir, v) != "running":
        raise Die(f"CT {v} not running")
    container.stop(simdir, v)
    return 0


def cmd_config(simdir: str, opts) -> int:
    v = _vmid(simdir, opts)
    if opts.get("snapshot") and opts.get("current"):
        raise ParamError("Parameter verification failed.", {
            "snapshot": "cannot use 'snapshot' parameter with 'current'",
            "current": "cannot use 'snapshot' parameter with 'current'"})
    conf = container.load_config(simdir, v)
    if opts.get("snapshot"):
        if opts["snapshot"] not in conf.snapshots:
            raise Die(f"snapshot '{opts['snapshot']}' does not exist")
        keys, raw = dict(conf.snapshots[opts["snapshot"]]), []
    else:
        # PVE::AbstractConfig::load_current_config: pending changes applied unless --current
        keys, raw = conf.current(bool(opts.get("current"))), conf.raw
    for k in sorted(keys):
        if k in ("digest", "lxc"):
            continue
        val = container.encode_text(keys[k]) if k == "description" else keys[k]
        sys.stdout.write(f"{k}: {val}\n")
    for k, val in raw:
        sys.stdout.write(f"{k}: {val}\n")
    return 0


def cmd_help(simdir: str, opts) -> int:
    extra = opts.get("extra-args") or []
    if not extra:
        print_usage_short(sys.stdout)
        return 0
    cmd = _expand(extra[0])
    if cmd is None:
        print_usage_short(sys.stderr, f"unknown command '{EXE} {extra[0]}'")
        return 255
    sys.stdout.write(f"USAGE: {usage_short(cmd)}\n")
    return 0


HANDLERS = {
    "config": cmd_config,
    "exec": cmd_exec,
    "help": cmd_help,
    "list": cmd_list,
    "shutdown": cmd_shutdown,
    "start": cmd_start,
    "status": cmd_status,
    "stop": cmd_stop,
}


def calls(simdir: str) -> List[List[str]]:
    """The pct invocations on this simulated node so far, oldest first: [pid, argument, ...] each (CALLS_LOG)."""
    try:
        with open(os.path.join(simdir, CALLS_LOG), encoding="utf-8") as f:
            return [line.split() for line in f if line.strip()]
    except FileNotFoundError:
        return []


def _record_call(simdir: Optional[str], argv: Sequence[str]) -> None:
    if not simdir:
        return
    line = " ".join([str(os.getpid())] + [a.replace("\n", " ") for a in argv]) + "\n"
    fd = os.open(os.path.join(simdir, CALLS_LOG), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one write with O_APPEND: concurrent pcts never interleave a line
    finally:
        os.close(fd)


def main(argv: Sequence[str], simdir: Optional[str] = None) -> int:
    simdir = simdir or os.environ.get("GPUSIM_DIR")
    argv = [str(a) for a in argv]
    _record_call(simdir, argv)
    time.sleep(startup_cost())  # the Perl start-up, before anything (even the usage) is printed
    if not argv:
        print_usage_short(sys.stderr, "no command specified")
        return 255
    cmd = _expand(argv[0])
    if cmd is None:
        print_usage_short(sys.stderr, f"unknown command '{EXE} {argv[0]}'")
        return 255
    try:
        if os.geteuid() != 0:
            # pve-common's PVE::CLIHandler (setup_default_cli_env): die "please run as root\n" if $> != 0
            raise Die("please run as root", 255)
        if not simdir:
            raise Die("pct: no scenario directory (GPUSIM_DIR is not set)")
        opts = get_options(cmd, argv[1:])
        return HANDLERS[cmd](simdir, opts)
    except ParamError as e:
        out = f"400 {e.msg}\n"
        for k in sorted(e.errors):
            out += f"{k}: {e.errors[k]}\n"
        out += usage_short(cmd) + "\n"
        sys.stderr.write(out)
        return 255
    except Die as e:
        sys.stderr.write(e.msg.rstrip("\n") + "\n")
        return e.code
    except container.NoSuchContainer as e:
        sys.stderr.write(f"{e}\n")
        return 2
    except container.ContainerError as e:
        sys.stderr.write(f"{e}\n")
        return 255
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

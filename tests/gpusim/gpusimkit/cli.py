"""gpusim: a simulated NVIDIA GPU host (and Proxmox VE node) for tests, demos and benchmarks.

  gpusim up     --dir DIR [--driver r580] [--gpus N] [--model NAME] [--memory-mib M] [--release-lag S]
                [--pid-mode host|translate] [--hide SYM,...]
  gpusim env    --dir DIR                       (export lines for the bindings, nvidia-smi and pct)
  gpusim ct create|start|stop --dir DIR --vmid ID [--hostname H] [--gpus all|0,1] [--systemd]
  gpusim hold   --dir DIR --gpus 0,1 --mib M [--ct VMID] [--tree] [--ignore-term] [--exit-delay S]
                [--respawn --service NAME] [--name NAME] [--type C|G|M|CG] [--device-only]
                [--only-own-devices] [--control-only] [--fork-child] [--restart-delay S] [--stop-timeout S]
  gpusim fault  --dir DIR [--init-error ...] [--lose-gpu I [--after S]] [--not-supported I:f,f] [--unknown I:f,f]
                [--health I:f=v,f=v] [--xid I:CODE] [--drain-ms MS] ...
  gpusim status --dir DIR [--json]
  gpusim down   --dir DIR

Invalid values exit 2 with a message naming the field; other failures exit 1.
(tests/gpusim/gpusim runs this module: ``python3 -m gpusimkit.cli``.)
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

from . import profiles
from . import scenario as scn
from .host import INIT_ERROR_NAMES, SimHost
from .scenario import ScenarioError


def _dir_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", default=os.environ.get("GPUSIM_DIR"),
                   help="the scenario directory (default $GPUSIM_DIR)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="gpusim", description="a simulated NVIDIA GPU host",
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("up", help="create the scenario directory and start the driver daemon")
    _dir_arg(p)
    p.add_argument("--driver", default=profiles.DEFAULT_PROFILE,
                   help=f"driver profile: {', '.join(profiles.NAMES)} (default {profiles.DEFAULT_PROFILE})")
    p.add_argument("--gpus", type=int, default=None, help="number of GPUs (default: the profile's, 8 for r580)")
    p.add_argument("--model", default=None, help=f"GPU name (default: the profile's, {scn.DEFAULT_MODEL} for r580)")
    p.add_argument("--memory-mib", type=int, default=None,
                   help=f"memory per GPU (default: the profile's, {scn.DEFAULT_MEMORY_MIB} for r580)")
    p.add_argument("--release-lag", type=float, default=0.0,
                   help="seconds an exited process's memory stays used (default 0)")
    p.add_argument("--pid-mode", default="translate", help="host or translate (default translate)")
    p.add_argument("--hide", default="",
                   help="NVML symbols the library does not export besides the profile's, comma separated")

    p = sub.add_parser("env", help="print export lines pointing programs at DIR")
    _dir_arg(p)

    p = sub.add_parser("ct", help="Proxmox containers")
    csub = p.add_subparsers(dest="ctcmd", metavar="create|start|stop")
    csub.required = True
    for verb in ("create", "start", "stop"):
        c = csub.add_parser(verb)
        _dir_arg(c)
        c.add_argument("--vmid", required=True, help="container id")
        if verb == "create":
            c.add_argument("--hostname", default=None)
            c.add_argument("--gpus", default="all", help="GPUs passed through: all or 0,1 (default all)")
            c.add_argument("--systemd", action="store_true",
                           help="a Debian 12 rootfs with systemd as PID 1 (services in it are systemd units); "
                                "default: busybox")

    p = sub.add_parser("hold", help="start a workload; prints its host pid")
    _dir_arg(p)
    p.add_argument("--gpus", required=True, help="0,1 or 0-3 or all or none")
    p.add_argument("--mib", type=int, default=1024, help="MiB per GPU (default 1024)")
    p.add_argument("--ct", default=None, help="start it inside this container")
    p.add_argument("--tree", action="store_true", help="inference-server tree: API parent + one worker per GPU")
    p.add_argument("--ignore-term", action="store_true", help="ignore SIGTERM")
    p.add_argument("--exit-delay", type=float, default=None, help="exit S seconds after SIGTERM")
    p.add_argument("--respawn", action="store_true", help="respawned by a supervisor unless stopped")
    p.add_argument("--service", default=None, help="service name (systemctl stop NAME)")
    p.add_argument("--name", default=None, help="process name (argv[0] and comm)")
    p.add_argument("--type", default="C", help="C, G, M or a mix like CG (default C)")
    p.add_argument("--device-only", action="store_true", help="hold device files only, no memory")
    p.add_argument("--only-own-devices", action="store_true",
                   help="open only the device nodes of --gpus (default: every GPU it can see, as CUDA)")
    p.add_argument("--control-only", action="store_true",
                   help="an NVML client: only nvidiactl and nvidia-uvm, no memory, nothing registered")
    p.add_argument("--fork-child", action="store_true",
                   help="fork a child that leaves the process group and keeps the device files")
    p.add_argument("--restart-delay", type=float, default=None, help="seconds before a respawn (service)")
    p.add_argument("--stop-timeout", type=float, default=None, help="seconds from SIGTERM to SIGKILL (service)")

    p = sub.add_parser("fault", help="inject or clear faults")
    _dir_arg(p)
    p.add_argument("--init-error", default=None, help="|".join(k for k in INIT_ERROR_NAMES if k != "ok"))
    p.add_argument("--lose-gpu", action="append", default=None, help="GPU index (repeatable)")
    p.add_argument("--after", type=float, default=None, help="lose the GPU S seconds from now")
    p.add_argument("--not-supported", action="append", default=None, help="I:field,field (repeatable)")
    p.add_argument("--unknown", action="append", default=None,
                   help="I:field,field: those queries answer NVML_ERROR_UNKNOWN on every call (repeatable)")
    p.add_argument("--unknown-every", default=None, help="every Nth device call returns UNKNOWN (0: never)")
    p.add_argument("--call-delay-ms", default=None, help="every NVML call sleeps this long")
    p.add_argument("--leak", action="append", default=None, help="I:MIB used with no process (repeatable)")
    p.add_argument("--pid-mode", default=None, help="host or translate")
    p.add_argument("--release-lag", type=float, default=None, help="seconds")
    p.add_argument("--hide", default=None,
                   help="SYM,SYM (the exact set besides the profile's; '' unhides all but the profile's)")
    p.add_argument("--health", action="append", default=None,
                   help="I:field=value,... health of GPU I: remap_pending=1, fabric_state=in_progress, ... (repeatable)")
    p.add_argument("--xid", action="append", default=None, help="I:CODE[,CODE]: Xid lines in DIR/kmsg (repeatable)")
    p.add_argument("--drain-ms", default=None, help="release an exited process's memory over this long after the lag")
    p.add_argument("--clear", action="store_true", help="clear every fault first")

    p = sub.add_parser("status", help="GPUs, processes, containers")
    _dir_arg(p)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("down", help="stop everything and remove DIR")
    _dir_arg(p)
    return ap


def _host(args) -> SimHost:
    host = SimHost(args.dir)
    if not os.path.exists(host.path("scenario.json")):
        raise ScenarioError(f"invalid dir={args.dir!r}: no simulated host there (gpusim up --dir ...)")
    return host


def _print_status(st) -> None:
    d = st["daemon"]
    s = st["scenario"]
    print(f"gpusim host {st['dir']}: {len(st['gpus'])} GPUs, driver {s['driver_version']} "
          f"(profile {s['driver_profile']}, _v3 entries {s['process_v3_entry_bytes']} bytes), "
          f"pid_mode {s['pid_mode']}, release_lag {s['release_lag_ms']} ms, "
          f"daemon pid {d['pid']} ({'running' if d['running'] else 'not running'})")
    faults = [f"{k}={v}" for k, v in s.items() if k in ("init_error", "unknown_every", "call_delay_ms") and v]
    extra = [h for h in s["hidden_symbols"] if h not in s["profile_hidden_symbols"]]
    if extra:
        faults.append("hidden=" + ",".join(extra))
    if faults:
        print("faults: " + " ".join(faults))
    print(f"{'GPU':>3}  {'NAME':<16} {'USED MiB':>9} {'TOTAL MiB':>9}  {'STATE':<6} PIDS")
    for g in st["gpus"]:
        state = "lost" if g["lost"] else "ok"
        extra = f" leaked={g['leaked_mib']}" if g["leaked_mib"] else ""
        if g["not_supported"]:
            extra += " not_supported=" + ",".join(g["not_supported"])
        if g.get("unknown"):
            extra += " unknown=" + ",".join(g["unknown"])
        pids = ",".join(str(p) for p in g["pids"]) or "-"
        print(f"{g['index']:>3}  {g['name']:<16} {g['memory_used_mib']:>9} {g['memory_total_mib']:>9}  {state:<6} {pids}{extra}")
    if st["processes"]:
        print("processes:")
        for p in st["processes"]:
            state = "alive" if p["alive"] else ("exited" if p["exit_ns"] is not None else "gone")
            print(f"  pid {p['pid']} (ns pid {p['nspid']}) gpu {p['gpu']} {p['types']} {p['used_mib']} MiB {state}")
    for c in st["containers"]:
        print(f"container {c['vmid']} ({c['hostname'] or '-'}, {c.get('kind', 'busybox')}): "
              f"{'running' if c['running'] else 'stopped'} (lxc-attach -n {c['vmid']} -P {c.get('lxcpath', '?')})")
    for sv in st["services"]:
        state = "stopped" if sv["stopped"] else ("running" if sv["pid"] else "inactive")
        print(f"service {sv['name']} ({sv['scope']}): {state}, main pid {sv['mainpid'] or '-'}")


def run(args) -> int:
    if not args.dir:
        raise ScenarioError("invalid dir=None: --dir is required (or $GPUSIM_DIR)")
    if args.cmd == "up":
        if args.release_lag < 0:
            raise ScenarioError(f"invalid release_lag={args.release_lag!r}: must be >= 0 seconds")
        SimHost.up(args.dir, gpus=args.gpus, model=args.model, memory_mib=args.memory_mib,
                   release_lag_ms=int(round(args.release_lag * 1000)), pid_mode=args.pid_mode,
                   hidden_symbols=[s for s in args.hide.split(",") if s.strip()], driver=args.driver)
        return 0
    if args.cmd == "env":
        for k, v in _host(args).env_vars().items():
            print(f"export {k}={shlex.quote(v)}")
        return 0
    if args.cmd == "down":
        report = SimHost(args.dir).down()
        for e in report["errors"]:
            print(f"gpusim: {e}", file=sys.stderr)
        return 1 if report["errors"] else 0
    host = _host(args)
    if args.cmd == "ct":
        from . import container  # noqa: PLC0415 (written by another piece)
        if not args.vmid.isdigit() or not 100 <= int(args.vmid) <= 999999999:
            raise ScenarioError(f"invalid vmid={args.vmid!r}: must be an integer 100..999999999")
        if args.ctcmd == "create":
            gpus = scn.parse_gpu_list(args.gpus, host.scenario().gpu_count)
            container.create(host.dir, int(args.vmid), args.hostname, gpus, systemd=args.systemd)
        elif args.ctcmd == "start":
            container.start(host.dir, int(args.vmid))
        else:
            container.stop(host.dir, int(args.vmid))
        return 0
    if args.cmd == "hold":
        pid = host.hold(args.gpus, args.mib, ct=args.ct, tree=args.tree, ignore_term=args.ignore_term,
                        exit_delay=args.exit_delay, respawn=args.respawn, service=args.service, name=args.name,
                        type=args.type, device_only=args.device_only, restart_delay=args.restart_delay,
                        stop_timeout=args.stop_timeout, only_own_devices=args.only_own_devices,
                        control_only=args.control_only, fork_child=args.fork_child)
        print(pid)
        return 0
    if args.cmd == "fault":
        lag = None
        if args.release_lag is not None:
            if args.release_lag < 0:
                raise ScenarioError(f"invalid release_lag={args.release_lag!r}: must be >= 0 seconds")
            lag = int(round(args.release_lag * 1000))
        hide = None
        if args.hide is not None:
            hide = [s for s in args.hide.split(",") if s.strip()]
        host.fault(init_error=args.init_error, lose_gpu=args.lose_gpu, after=args.after,
                   not_supported=args.not_supported, unknown=args.unknown, unknown_every=args.unknown_every,
                   call_delay_ms=args.call_delay_ms, leak=args.leak, pid_mode=args.pid_mode, release_lag_ms=lag,
                   hide=hide, health=args.health, xid=args.xid, drain_ms=args.drain_ms, clear=args.clear)
        return 0
    if args.cmd == "status":
        st = host.status()
        if args.json:
            print(json.dumps(st, indent=1, sort_keys=True))
        else:
            _print_status(st)
        return 0
    raise AssertionError(args.cmd)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except ScenarioError as e:
        print(f"gpusim {args.cmd}: error: {e}", file=sys.stderr)
        return 2
    except (RuntimeError, OSError) as e:  # SimError, DriverError, ContainerError, BuildError, ...
        print(f"gpusim {args.cmd}: error: {e}", file=sys.stderr)
        # pct-style errors about a bad value (ContainerError "invalid hostname=...") are usage errors too
        return 2 if str(e).startswith("invalid ") else 1


if __name__ == "__main__":
    sys.exit(main())

"""A test driver that plays Horovod elastic's launcher, by its documented rules.

Horovod cannot be installed on our machines, so etjob proves its side of the
contract with this stand-in for `horovodrun --host-discovery-script`:

* it runs the discovery script every second and reads `host:slots` lines;
* it runs the workload on each host through the rsh agent, as horovodrun does
  through ssh/MPI (`$OMPI_MCA_plm_rsh_agent HOST COMMAND`, etjob's kubexec.sh);
* a host whose command fails is blacklisted for good, by name (Horovod's default
  without --blacklist-cooldown-range), so a replacement needs a new name;
* at least one host from before each membership change must survive it, else
  the job fails (Horovod's state can only be restored from a surviving rank);
* a worker that exits 0 ends the whole job; 75 (etjob's graceful leave) does not.

Usage: python3 -m etjob.horovod_driver --host-discovery-script /etc/edl/discover_hosts.sh
         --min-np 1 --max-np 3 --rounds 40 [--command hostname]
Each round runs COMMAND once on every usable host (a "step"); after ROUNDS
rounds the driver exits 0, which completes a horovod ElasticJob.
"""

import argparse
import concurrent.futures
import os
import subprocess
import sys
import time


def log(msg):
    sys.stdout.write("%s t=%.3f\n" % (msg, time.time()))
    sys.stdout.flush()


def discover(script):
    try:
        out = subprocess.run([script], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        log("discovery failed: %s" % e)
        return {}
    hosts = {}
    for line in out.splitlines():
        line = line.strip()
        if not line:
            continue
        host, _, slots = line.rpartition(":")
        if not host or not slots.isdigit():
            log("discovery: malformed line %r" % line)
            continue
        hosts[host] = int(slots)
    return hosts


def run_on(agent, host, command, timeout):
    try:
        p = subprocess.run([agent, host, command], capture_output=True, text=True, timeout=timeout)
        return host, p.returncode, (p.stdout + p.stderr).strip()
    except subprocess.TimeoutExpired:
        return host, 124, "timeout"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host-discovery-script", default="/etc/edl/discover_hosts.sh")
    ap.add_argument("--min-np", type=int, default=1)
    ap.add_argument("--max-np", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--command", default="hostname")
    ap.add_argument("--rsh-agent", default=os.environ.get("OMPI_MCA_plm_rsh_agent", "/etc/edl/kubexec.sh"))
    ap.add_argument("--timeout", type=float, default=30)
    args = ap.parse_args(argv)

    blacklist = set()
    members = []  # the hosts of the current membership
    rounds = 0
    last_discovery = 0.0
    while rounds < args.rounds:
        if time.time() - last_discovery >= 1.0:
            found = discover(args.host_discovery_script)
            last_discovery = time.time()
        usable = [h for h in sorted(found) if h not in blacklist][: args.max_np]
        if len(usable) < args.min_np:
            time.sleep(1)
            continue
        if usable != members:
            if members:
                survivors = [h for h in members if h in usable]
                if not survivors:
                    log("FAIL no host of the previous membership %s survived the change to %s" % (members, usable))
                    return 1
                log("membership change: %s -> %s (survivors %s)" % (members, usable, survivors))
            for h in usable:
                if h not in members:
                    log("new host %s" % h)
            members = usable
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(members)) as ex:
            results = list(ex.map(lambda h: run_on(args.rsh_agent, h, args.command, args.timeout), members))
        failed = False
        for host, code, out in results:
            if code == 75:
                log("host %s left gracefully (exit 75)" % host)
                blacklist.add(host)
                failed = True
            elif code != 0:
                log("blacklisted %s (exit code %d: %s)" % (host, code, out[-200:]))
                blacklist.add(host)
                failed = True
        if failed:
            continue  # Horovod restores the state from the survivors and retries the step
        rounds += 1
        log("round %d on %s" % (rounds, ",".join(members)))
        time.sleep(0.5)
    log("done after %d rounds" % rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())

package processnode

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
)

// sandboxScript runs as the first process of a pod's namespaces (PID 1 of
// its PID namespace). Its positional parameters are the hosts file, the
// hostname, the working directory, the number of mounts, then source, target
// and "ro"/"rw" per mount, then the container's argv. The working directory
// is entered after the mounts (it may be inside one, such as an image's
// /examples) and created when missing, as runc does. Arguments, not environment, so that
// nothing of it leaks into the container's environment.
//
// It does not exec the container's command but runs it as PID 2 and waits:
// a PID 1 ignores every signal it has no handler for, so an exec'd command
// without a SIGTERM handler (sleep, a plain Python script) would sit out the
// whole grace period. As PID 2 in the container's process group it gets the
// node's SIGTERM like before, and the shell's exit status is its exit code
// (128+signal when a signal killed it). A shell starts a background command
// with SIGINT and SIGQUIT ignored, and every process inherits the signals its
// parent ignored (under make, signal 32 was): coreutils env (8.31 and later)
// restores every default, as a container runtime starts a container. The shell reaps orphans, and when it dies (SIGKILL) the
// kernel kills every process left in the namespace.
const sandboxScript = `set -e
hosts=$1 host=$2 wd=$3 n=$4
shift 4
mount --bind "$hosts" /etc/hosts
echo "$host" > /proc/sys/kernel/hostname
while [ "$n" -gt 0 ]; do
	src=$1 dst=$2 mode=$3
	shift 3
	if [ -d "$src" ]; then
		mkdir -p "$dst"
	else
		mkdir -p "$(dirname "$dst")"
		[ -e "$dst" ] || : > "$dst"
	fi
	mount --bind "$src" "$dst"
	if [ "$mode" = ro ]; then mount -o remount,bind,ro "$dst"; fi
	n=$((n-1))
done
mkdir -p "$wd"
cd "$wd"
set +e
if env --default-signal true 2>/dev/null; then
	env --default-signal "$@" &
else
	"$@" &
fi
wait $!
`

// mount is one bind mount of a container: a host path at the container's
// mountPath.
type mount struct {
	source   string
	target   string
	readOnly bool
}

// sandboxArgv returns the argv that runs argv (argv[0] a resolved path) in new
// mount, UTS and PID namespaces with the pod's hosts file, hostname and
// mounts. unshare (util-linux) does the namespaces: --fork puts the shell
// into the new PID namespace, --kill-child kills it when unshare dies,
// --mount-proc gives it a /proc of its own, and unshare exits with the
// shell's status (it re-raises a signal that killed the shell).
func sandboxArgv(unshare, hostsPath, hostname, workDir string, mounts []mount, argv []string) []string {
	out := []string{unshare, "--mount", "--uts", "--pid", "--fork", "--kill-child", "--mount-proc",
		"--propagation", "private", "--", "/bin/sh", "-c", sandboxScript, "etjob-pod",
		hostsPath, hostname, workDir, strconv.Itoa(len(mounts))}
	for _, m := range mounts {
		mode := "rw"
		if m.readOnly {
			mode = "ro"
		}
		out = append(out, m.source, m.target, mode)
	}
	return append(out, argv...)
}

// detectSandbox returns the path of unshare when pods can get namespaces of
// their own here, or "" and why not: it needs root (CAP_SYS_ADMIN) and
// util-linux's unshare, and a trial run proves both (a container without
// CAP_SYS_ADMIN has root but cannot unshare).
func detectSandbox() (string, string) {
	if os.Geteuid() != 0 {
		return "", "the node does not run as root"
	}
	path, err := exec.LookPath("unshare")
	if err != nil {
		return "", "util-linux unshare is not installed"
	}
	if _, err := exec.LookPath("nsenter"); err != nil {
		return "", "util-linux nsenter is not installed"
	}
	out, err := exec.Command(path, "--mount", "--uts", "--pid", "--fork", "--kill-child", "--mount-proc",
		"--propagation", "private", "--", "/bin/sh", "-c", "mount --bind /etc/hosts /etc/hosts && echo probe > /proc/sys/kernel/hostname").CombinedOutput()
	if err != nil {
		return "", fmt.Sprintf("unshare failed (%v): %s", err, strings.TrimSpace(string(out)))
	}
	return path, ""
}

// nsInitPID returns the host PID of the first process in the namespaces that
// the unshare process pid created (its only child, the sandbox shell), or 0
// when it has none yet.
func nsInitPID(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			child, _ := strconv.Atoi(f[0])
			return child
		}
		return 0
	}
	// Kernels without CONFIG_PROC_CHILDREN: look for the child by its parent.
	for _, p := range processes() {
		if p.ppid == pid {
			return p.pid
		}
	}
	return 0
}

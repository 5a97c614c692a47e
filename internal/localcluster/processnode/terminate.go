package processnode

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// terminate sends SIGTERM to the container whose processes form the process
// group pgid, as a container runtime sends it to the container's PID 1. A
// PID 1 ignores every signal it has no handler for, so the container's main
// process (its command) is spared when it has no SIGTERM handler and other
// processes run under it: a shell such as `sh -c "python3 -m etjob.torchrun
// train.py"` (dash forks, it does not exec, the command). Its descendants get
// the SIGTERM and may stop gracefully; the shell ends when they did. Without
// this the shell died at once, and with it the sandbox's PID namespace, whose
// kernel SIGKILLs every process left in it: a scheduler's preemption of a
// worker became a hard loss instead of an agreed stop (issue #14). A main
// process with a handler, or with nothing under it (a plain `sleep`), gets
// the SIGTERM as the whole group always did. main is the container's main
// process (0: unknown, signal the whole group).
func terminate(pgid, main int) {
	if main > 0 && !handlesSignal(main, syscall.SIGTERM) {
		members := groupMembers(pgid)
		parent := false
		for _, m := range members {
			if m.ppid == main {
				parent = true
			}
		}
		if parent {
			for _, m := range members {
				if m.pid != main {
					_ = syscall.Kill(m.pid, syscall.SIGTERM)
				}
			}
			return
		}
	}
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
}

// mainProcess is the host PID of a container's command: in a sandbox (the
// unshare process pid, its child the namespace's init shell) the init's
// child; without one, pid itself. 0 when it is not known yet.
func mainProcess(pid int, namespaced bool) int {
	if !namespaced {
		return pid
	}
	init := nsInitPID(pid)
	if init == 0 {
		return 0
	}
	return nsInitPID(init)
}

// proc is one process of the host, from /proc/PID/stat.
type proc struct{ pid, ppid, pgrp int }

// processes lists every process of the host (their pid, parent and process
// group, from /proc/PID/stat; the fields after the command's closing paren).
func processes() []proc {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var out []proc
	for _, s := range stats {
		b, err := os.ReadFile(s)
		if err != nil {
			continue
		}
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 3 {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(s)))
		ppid, _ := strconv.Atoi(f[1])
		pgrp, _ := strconv.Atoi(f[2])
		out = append(out, proc{pid, ppid, pgrp})
	}
	return out
}

// groupMembers lists the processes of process group pgid.
func groupMembers(pgid int) []proc {
	var out []proc
	for _, p := range processes() {
		if p.pgrp == pgid {
			out = append(out, p)
		}
	}
	return out
}

// handlesSignal reports whether process pid has a handler for sig (its
// SigCgt mask in /proc/pid/status).
func handlesSignal(pid int, sig syscall.Signal) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "SigCgt:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && mask&(1<<(uint(sig)-1)) != 0
		}
	}
	return false
}

// Package processnode is a virtual-kubelet (v1.14) provider and node whose
// pods run as processes on this machine: the "process nodes" of etjob's
// single-machine Kubernetes cluster. The API server, scheduler, controllers
// and leases are real; only the container runtime is replaced by os/exec.
//
// A process pod runs the host's binaries. The image field is ignored, so a
// container must set command (there is no image entrypoint); a worker that
// needs Python packages from the source tree gets them the way the example
// jobs do it, by setting PYTHONPATH in the container's env.
//
// What a pod gets, as a kubelet would give it:
//
//   - One process group per container (Setpgid), started with command+args
//     ($(VAR) expanded), workingDir (default: the pod's directory), and an
//     environment of PATH, HOME and HOSTNAME (the pod name) followed by the
//     container's envFrom and env, resolved here: literal values with $(VAR)
//     expansion, fieldRef (metadata.name, .namespace, .uid, .labels['k'],
//     .annotations['k'], spec.nodeName, spec.serviceAccountName,
//     status.podIP(s), status.hostIP(s)), and configMap/secret keys. The node
//     runs virtual-kubelet with SkipDownwardAPIResolution, because its own
//     resolver refuses status.hostIP and status.podIP.
//   - stdout and stderr appended to <work-dir>/pods/<ns>_<name>_<uid>/<container>.log
//     (GetContainerLogs returns that file), and the process group ID in
//     <container>.pid while it runs, so that whoever cleans up after a node
//     that was killed can kill the group.
//   - Its own IPv4 loopback address as status.podIP: the lowest free address
//     of the /24 that holds the node's IP (node 127.0.1.1 gives pods
//     127.0.1.2, 127.0.1.3, ...; a deleted pod's address is reused), and the
//     node's IP as status.hostIP. Nothing confines a process to its address:
//     it is the address the workload should bind, via the downward API.
//   - Status: Pending, then Running with Ready once every container started,
//     then Succeeded or Failed with each container's exit code (128+signal
//     for a process killed by a signal) in state.terminated. restartPolicy
//     Never leaves an exited container alone; OnFailure and Always restart it
//     after a kubelet's crash-loop back-off (10 s doubling to 5 min).
//   - Deletion: SIGTERM to every process group, SIGKILL after the grace
//     period (the deletion's, else terminationGracePeriodSeconds; between 2 s
//     and 30 s). When a container's main process exits, the rest of its
//     process group is killed at once, as a PID namespace would. Once all
//     processes exited and the terminal status reached the API server, the
//     pod object is removed (grace period 0, UID precondition) like a
//     kubelet's status manager does, instead of when the grace period ends.
//
// The node registers with the given labels, capacity (cpu, memory, pods and
// one emulated nvidia.com/gpu), an InternalIP address, no taints, keeps its
// Lease in kube-node-lease and turns Ready once its pod controller synced.
//
// Not yet:
//
//   - PID, mount, UTS and network namespaces: a process that starts its own
//     session (setsid) escapes its pod's process group; the pod has no
//     hostname or /etc/hosts of its own.
//   - Volumes of any kind, projected service-account tokens, and service
//     environment variables (KUBERNETES_SERVICE_HOST, ...).
//   - Init containers (such a pod is rejected), probes, resource limits and
//     resourceFieldRef env, activeDeadlineSeconds.
//   - The kubelet HTTP API (logs, exec, attach, port-forward, stats): no
//     server listens, so `kubectl logs` does not work; read the log files.
//   - Log options (tail, since, follow) in GetContainerLogs.
//   - Adopting the processes of a previous node process: a restarted node
//     starts every pod bound to it again.
package processnode

// Package processnode is a virtual-kubelet (v1.14) provider and node whose
// pods run as processes on this machine: the "process nodes" of etjob's
// single-machine Kubernetes cluster. The API server, scheduler, controllers
// and leases are real; only the container runtime is replaced by os/exec.
//
// A process pod runs the host's binaries. Nothing is pulled: the node's image
// table (Image) says what an image brings, environment defaults and files
// bind-mounted read-only; an image it does not match runs the host as it is.
// A container must set command (there is no image entrypoint).
//
// What a pod gets, as a kubelet would give it:
//
//   - Namespaces of its own when the node runs as root and util-linux
//     unshare works (checked once at start; otherwise the node logs why and
//     runs plain processes): every container runs under
//     `unshare --mount --uts --pid --fork --kill-child --mount-proc` whose
//     first process, a small shell, bind-mounts the node's hosts file over
//     /etc/hosts, sets the hostname (spec.hostname, else the pod name, cut
//     to 63 characters), bind-mounts the volumes, and runs the container's
//     command as PID 2 and waits for it. PID 2, not an exec'd PID 1, so that
//     a command without a SIGTERM handler still stops on SIGTERM; SIGINT and
//     SIGQUIT keep their default too. When the shell dies the kernel kills
//     everything left in the PID namespace, so even a process that started
//     its own session goes with its pod. A mountPath that does not exist is
//     created on the host (an empty directory) to mount onto.
//   - One process group per container (Setpgid), started with command+args
//     ($(VAR) expanded), workingDir (default: the pod's directory; entered
//     after the mounts, and created when missing, as runc does), and an
//     environment of PATH, HOME, HOSTNAME (the pod's hostname),
//     KUBERNETES_SERVICE_HOST/PORT (the API server) and the image's env,
//     followed by the container's envFrom and env, resolved here: literal values with
//     $(VAR) expansion, fieldRef (metadata.name, .namespace, .uid,
//     .labels['k'], .annotations['k'], spec.nodeName,
//     spec.serviceAccountName, status.podIP(s), status.hostIP(s)),
//     resourceFieldRef (the container's limits and requests), and
//     configMap/secret keys. The node runs virtual-kubelet with
//     SkipDownwardAPIResolution, because its own resolver refuses
//     status.hostIP and status.podIP.
//   - Name resolution without a cluster DNS: the node keeps one hosts file
//     (<work-dir>/hosts), the /etc/hosts of all its pods, current from every
//     pod of the cluster (a watch, rewritten within a second). A pod with
//     spec.hostname and spec.subdomain gets
//     "<ip> <h>.<sub>.<ns>.svc.cluster.local <h>.<sub>.<ns>.svc <h>.<sub> <h>",
//     fully qualified name first because torch's elastic agent publishes
//     socket.getfqdn() of rank 0 as MASTER_ADDR; any other pod
//     "<ip> <pod name>" (its spec.hostname first if it has one). The file is rewritten in place, as a bind mount of a
//     single file keeps the old inode after a rename. Pods that share a short
//     name (the same hostname in two namespaces) resolve to the first line.
//   - Volumes at their mountPath: emptyDir (a directory under the pod's
//     directory), hostPath (created for DirectoryOrCreate and FileOrCreate),
//     persistentVolumeClaim bound to a hostPath or local PersistentVolume,
//     configMap, secret, downwardAPI (fieldRef items) and projected
//     (configMap, secret, downwardAPI and serviceAccountToken sources; the
//     token comes from the TokenRequest API, bound to the pod, and is renewed
//     after 80% of its life), so a pod gets
//     /var/run/secrets/kubernetes.io/serviceaccount/{token,ca.crt,namespace}
//     as the API server's ServiceAccount admission asks for it. configMap,
//     secret, downwardAPI and projected volumes are read-only and written
//     the kubelet's way (a timestamped directory, a "..data" symlink swapped
//     with a rename, "key -> ..data/key" links; items, defaultMode and mode
//     honoured) and rewritten every second from the current objects, so an
//     update reaches the pod within about a second. While a volume cannot be
//     set up (an unbound claim, a missing ConfigMap) the pod stays Pending,
//     its containers waiting in ContainerCreating with the reason as message,
//     and the node retries every second.
//   - stdout and stderr appended to <work-dir>/pods/<ns>_<name>_<uid>/<container>.log,
//     and the process group ID (unshare's PID) in <container>.pid while it
//     runs, so that whoever cleans up after a node that was killed can kill
//     the group.
//   - The kubelet API on <node IP>:10250 (virtual-kubelet's handlers, a
//     self-signed certificate made at start), so `kubectl logs` (follow,
//     tailLines, limitBytes) and `kubectl exec` work through the API server
//     (kube-apiserver --kubelet-preferred-address-types=InternalIP; without
//     --kubelet-certificate-authority it does not verify the certificate).
//     exec runs the command with the container's environment and working
//     directory in the container's mount, UTS and PID namespaces (nsenter
//     into the sandbox shell). With Options.ClientCAs (etjob-node
//     --client-ca-file) the node serves only callers whose client
//     certificate those CAs signed, as a kubelet's --client-ca-file does:
//     the local cluster gives the API server such a certificate
//     (--kubelet-client-certificate) and no one else. It authorizes nothing
//     beyond that (no SubjectAccessReview of the kubelet API).
//   - Its own IPv4 loopback address as status.podIP: the lowest free address
//     of the /24 that holds the node's IP (node 127.0.1.1 gives pods
//     127.0.1.2, 127.0.1.3, ...; a deleted pod's address is reused), and the
//     node's IP as status.hostIP. There is no network namespace, so nothing
//     confines a process to its address: it is the address the workload
//     should bind, via the downward API. A hostNetwork pod gets the
//     node's IP, as on a kubelet.
//   - Status: Pending, then Running with Ready once every container started,
//     then Succeeded or Failed with each container's exit code (128+signal
//     for a process killed by a signal) in state.terminated, and, under
//     terminationMessagePolicy FallbackToLogsOnError, the end of its log
//     (80 lines, 2048 bytes) as the message of a failure. restartPolicy
//     Never leaves an exited container alone; OnFailure and Always restart it
//     (in fresh namespaces, with the same mounts) after a kubelet's
//     crash-loop back-off (10 s doubling to 5 min).
//   - Deletion: SIGTERM to every process group (but to a main process that
//     has no SIGTERM handler and runs others, such as `sh -c CMD`: a
//     container's PID 1 ignores it, and its death would end the namespace
//     before CMD stopped gracefully), SIGKILL after the grace
//     period (the deletion's, else terminationGracePeriodSeconds; between 2 s
//     and 30 s). When a container's main process exits, the rest of its
//     process group (and, with namespaces, its PID namespace) is killed at
//     once. Once all processes exited and the terminal status reached the
//     API server, the pod object is removed (grace period 0, UID
//     precondition) like a kubelet's status manager does, instead of when
//     the grace period ends.
//
// The node registers with the given labels, capacity (cpu, memory, pods and
// one emulated nvidia.com/gpu), an InternalIP address, no taints, keeps its
// Lease in kube-node-lease and turns Ready once its pod controller synced.
//
// Not yet:
//
//   - Network and IPC namespaces; without root or unshare, any namespace: then
//     a process that starts its own session (setsid) escapes its pod's
//     process group, and the pod has no hostname, /etc/hosts or volume
//     mounts of its own (volume contents are still under the pod directory).
//   - Service environment variables other than KUBERNETES_SERVICE_*,
//     subPathExpr, downwardAPI volume resourceFieldRef, clusterTrustBundle and
//     podCertificate projections, and volume types other than those above.
//   - Init containers (such a pod is rejected), probes, resource limits
//     (not enforced; resourceFieldRef env reads the container's own, and an unset
//     limit is refused rather than given the node's allocatable),
//     activeDeadlineSeconds.
//   - In the kubelet API: attach, port-forward, stats and metrics; a TTY for
//     exec; timestamps, sinceSeconds, sinceTime and previous for logs (the
//     log file holds no timestamps and spans every run of the container);
//     tailLines=0 returns the whole log (virtual-kubelet passes it as unset).
//   - Adopting the processes of a previous node process: a restarted node
//     starts every pod bound to it again.
package processnode

package processnode

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	utilexec "k8s.io/utils/exec"
)

// followPoll is how often a followed log is checked for new output.
const followPoll = 200 * time.Millisecond

// selfSignedCert returns a serving certificate for the node's kubelet API.
// The API server does not verify it: without --kubelet-certificate-authority
// its kubelet client skips verification.
func selfSignedCert(nodeName, nodeIP string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: nodeName},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.AddDate(1, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{nodeName},
	}
	if ip := net.ParseIP(nodeIP); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// GetContainerLogs returns the container's log file (every run of the
// container, appended) as the kubelet API serves it: the last opts.Tail
// lines when set, at most opts.LimitBytes bytes when set, and with
// opts.Follow new output until the process that runs now exits or ctx ends.
// The file holds no timestamps, so timestamps, sinceSeconds and sinceTime
// are ignored, and previous returns the same file.
func (p *Provider) GetContainerLogs(ctx context.Context, namespace, podName, containerName string, opts api.ContainerLogOpts) (io.ReadCloser, error) {
	path, err := p.LogPath(namespace, podName, containerName)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	if opts.Tail > 0 {
		off, err := tailOffset(f, opts.Tail)
		if err == nil {
			_, err = f.Seek(off, io.SeekStart)
		}
		if err != nil {
			f.Close()
			return nil, err
		}
	}
	var r io.Reader = f
	if opts.Follow {
		pid := p.containerPID(namespace, podName, containerName)
		r = &followReader{ctx: ctx, f: f, running: func() bool {
			return pid != 0 && p.containerPID(namespace, podName, containerName) == pid
		}}
	}
	if opts.LimitBytes > 0 {
		r = io.LimitReader(r, int64(opts.LimitBytes))
	}
	return struct {
		io.Reader
		io.Closer
	}{r, f}, nil
}

// containerPID is the PID of the container's process, 0 when none runs.
func (p *Provider) containerPID(namespace, podName, containerName string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pr, ok := p.pods[podKey(namespace, podName)]; ok {
		for _, cr := range pr.containers {
			if cr.name == containerName {
				return cr.pid
			}
		}
	}
	return 0
}

// tailOffset returns the offset at which the last n lines of f start.
func tailOffset(f *os.File, n int) (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	end := fi.Size()
	buf := make([]byte, 32*1024)
	newlines := 0
	pos := end
	for pos > 0 {
		size := min(int64(len(buf)), pos)
		pos -= size
		if _, err := f.ReadAt(buf[:size], pos); err != nil && !errors.Is(err, io.EOF) {
			return 0, err
		}
		for i := size - 1; i >= 0; i-- {
			if buf[i] != '\n' || pos+i == end-1 { // a final newline ends the last line
				continue
			}
			newlines++
			if newlines == n {
				return pos + i + 1, nil
			}
		}
	}
	return 0, nil
}

// followReader reads a growing log file until the container's process
// exited and the file is drained, or ctx ends.
type followReader struct {
	ctx     context.Context
	f       *os.File
	running func() bool
}

func (r *followReader) Read(b []byte) (int, error) {
	for {
		n, err := r.f.Read(b)
		if n > 0 || !errors.Is(err, io.EOF) {
			return n, err
		}
		if !r.running() {
			// The process is gone: one more read picks up what it wrote last.
			if n, err = r.f.Read(b); n > 0 {
				return n, nil
			}
			return 0, io.EOF
		}
		select {
		case <-r.ctx.Done():
			// The client went away; an error here would make virtual-kubelet
			// write a status after the body.
			return 0, io.EOF
		case <-time.After(followPoll):
		}
	}
}

// RunInContainer runs cmd in the container's pod with the container's
// environment and working directory, as `kubectl exec` does: with
// namespaces, nsenter joins the mount, UTS and PID namespaces of the pod's
// first process, so the command sees the pod's hostname, /etc/hosts,
// volumes and processes. A TTY is not allocated (stdin, stdout and stderr
// are plain streams). A non-zero exit reaches the client as the command's
// exit code.
func (p *Provider) RunInContainer(ctx context.Context, namespace, podName, containerName string, cmd []string, attach api.AttachIO) error {
	if len(cmd) == 0 {
		return errdefs.InvalidInput("exec: no command")
	}
	p.mu.Lock()
	pr, ok := p.pods[podKey(namespace, podName)]
	var cr *containerRun
	if ok {
		for _, c := range pr.containers {
			if c.name == containerName {
				cr = c
			}
		}
	}
	var pid int
	var env []string
	var dir string
	if cr != nil {
		pid, env, dir = cr.pid, cr.env, cr.dir
	}
	p.mu.Unlock()
	if cr == nil {
		return errdefs.NotFoundf("pod %s/%s has no container %q on node %s", namespace, podName, containerName, p.nodeName)
	}
	if pid == 0 {
		return errdefs.InvalidInputf("container %q of pod %s/%s is not running", containerName, namespace, podName)
	}
	argv := cmd
	if p.unshare != "" {
		initPID := 0
		for range 20 { // unshare forks its child right after it starts
			if initPID = nsInitPID(pid); initPID != 0 {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if initPID == 0 {
			return fmt.Errorf("container %q of pod %s/%s: no process in its namespaces", containerName, namespace, podName)
		}
		argv = append([]string{"nsenter", "-t", strconv.Itoa(initPID), "-m", "-u", "-p", "--wd=" + dir, "--"}, cmd...)
	}
	c := exec.CommandContext(ctx, argv[0], argv[1:]...)
	if p.unshare == "" {
		c.Path = lookPath(cmd[0], envValue(env, "PATH", defaultPath))
		c.Err = nil
	}
	c.Env = env
	if p.unshare == "" {
		c.Dir = dir // else nsenter --wd enters it inside the container's mounts
	}
	if in := attach.Stdin(); in != nil {
		c.Stdin = in
	}
	if out := attach.Stdout(); out != nil {
		c.Stdout = out
	}
	if errOut := attach.Stderr(); errOut != nil {
		c.Stderr = errOut
	}
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	c.Cancel = func() error { return syscall.Kill(-c.Process.Pid, syscall.SIGKILL) }
	c.WaitDelay = time.Second // a background process may hold the output open
	err := c.Run()
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		code, _ := exitCode(exitErr.ProcessState)
		return utilexec.CodeExitError{Err: err, Code: int(code)}
	}
	return err
}

// envValue returns the last value of name in env, or def.
func envValue(env []string, name, def string) string {
	v := def
	for _, kv := range env {
		if len(kv) > len(name) && kv[:len(name)] == name && kv[len(name)] == '=' {
			v = kv[len(name)+1:]
		}
	}
	return v
}

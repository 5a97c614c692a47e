package localcluster

import (
	"os"
	"path/filepath"

	"github.com/etjob/etjob/internal/localcluster/processnode"
)

// HorovodVersion is the Horovod that hack/install-horovod.sh builds.
const HorovodVersion = "0.28.1"

// imagePath is the PATH of the local image after its Python's bin
// directory: the standard directories only, never the PATH of whoever
// started the cluster (a pyenv shim first on it would pick an interpreter
// without torch).
const imagePath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// HorovodVenv is the venv that hack/install-horovod.sh builds (Debian's
// torch plus Horovod), or "" when it is not installed.
func HorovodVenv() string {
	cache := os.Getenv("ETJOB_CACHE")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return ""
		}
		cache = filepath.Join(home, ".cache", "etjob")
	}
	venv := filepath.Join(cache, "horovod", "venv-"+HorovodVersion)
	if _, err := os.Stat(filepath.Join(venv, "bin", "horovodrun")); err != nil {
		return ""
	}
	return venv
}

// LocalImages is the image table of the local cluster: every image runs
// "the local image", which is what a training image built for etjob holds:
// Debian's Python 3 with torch and, when hack/install-horovod.sh installed
// it, Horovod (`python`, `python3` and `horovodrun` first on PATH); etjob's
// worker library (import etjob.supervisor, import kubeai.elastic) on
// PYTHONPATH; the repository at /opt/etjob and its examples at /examples
// (where Horovod's own images keep theirs). A user's image name is kept in
// the pod; only its content is emulated.
func LocalImages(repo, horovodVenv string) processnode.Images {
	path := imagePath
	if horovodVenv != "" {
		path = filepath.Join(horovodVenv, "bin") + ":" + path
	}
	return processnode.Images{{
		Image: "*",
		Env:   map[string]string{"PATH": path, "PYTHONPATH": "/opt/etjob/python"},
		Files: map[string]string{"/opt/etjob": repo, "/examples": filepath.Join(repo, "examples")},
	}}
}

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

// Torch2Version is the torch that hack/install-torch2.sh installs from PyPI.
const Torch2Version = "2.15.0"

// Torch2Image is the image prefix the local cluster runs on PyPI's torch
// 2.15 (hack/install-torch2.sh's venv), when that venv is installed: a job
// whose image is pytorch/pytorch:2.<anything> trains on torch 2.x, as it
// would on that image; every other image runs Debian's torch 1.13.
const Torch2Image = "pytorch/pytorch:2*"

// HorovodVenv is the venv that hack/install-horovod.sh builds (Debian's
// torch plus Horovod), or "" when it is not installed.
func HorovodVenv() string {
	return cachedVenv(filepath.Join("horovod", "venv-"+HorovodVersion), "horovodrun")
}

// Torch2Venv is the venv that hack/install-torch2.sh installs (PyPI's torch
// 2.15, torchft, numpy, scikit-learn), or "" when it is not installed.
func Torch2Venv() string {
	return cachedVenv(filepath.Join("torch2", "venv-"+Torch2Version), "python3")
}

// cachedVenv is the venv at rel under etjob's cache ($ETJOB_CACHE, else
// ~/.cache/etjob) when its bin holds program, else "".
func cachedVenv(rel, program string) string {
	cache := os.Getenv("ETJOB_CACHE")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return ""
		}
		cache = filepath.Join(home, ".cache", "etjob")
	}
	venv := filepath.Join(cache, rel)
	if _, err := os.Stat(filepath.Join(venv, "bin", program)); err != nil {
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
// (where Horovod's own images keep theirs). When hack/install-torch2.sh
// installed its venv, images named Torch2Image* hold the same with PyPI's
// torch 2.15 first on PATH instead (no Horovod: it cannot build on torch
// 2.x). A user's image name is kept in the pod; only its content is
// emulated. The first entry is the default image.
func LocalImages(repo, horovodVenv string) processnode.Images {
	path := imagePath
	if horovodVenv != "" {
		path = filepath.Join(horovodVenv, "bin") + ":" + path
	}
	files := map[string]string{"/opt/etjob": repo, "/examples": filepath.Join(repo, "examples")}
	images := processnode.Images{{
		Image: "*",
		Env:   map[string]string{"PATH": path, "PYTHONPATH": "/opt/etjob/python"},
		Files: files,
	}}
	if venv := Torch2Venv(); venv != "" {
		images = append(images, processnode.Image{
			Image: Torch2Image,
			Env:   map[string]string{"PATH": filepath.Join(venv, "bin") + ":" + imagePath, "PYTHONPATH": "/opt/etjob/python"},
			Files: files,
		})
	}
	return images
}

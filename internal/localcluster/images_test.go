package localcluster

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLocalImagesTorch2: with hack/install-torch2.sh's venv in etjob's
// cache, an image named pytorch/pytorch:2... runs that venv's python3 and
// every other image Debian's; without the venv there is one image.
func TestLocalImagesTorch2(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("ETJOB_CACHE", cache)
	if got := LocalImages("/repo", ""); len(got) != 1 {
		t.Fatalf("without the venv: %d images, want 1: %+v", len(got), got)
	}
	bin := filepath.Join(cache, "torch2", "venv-"+Torch2Version, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "python3"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	images := LocalImages("/repo", "/hvd")
	for ref, want := range map[string]string{
		"pytorch/pytorch:2.15.0-cuda12.8-cudnn9-runtime": bin + ":",
		"etjob/digits:local":                             "/hvd/bin:",
		"pytorch/pytorch:1.13.1-cuda11.6-cudnn8-runtime": "/hvd/bin:",
	} {
		im, ok := images.Lookup(ref)
		if !ok || !strings.HasPrefix(im.Env["PATH"], want) {
			t.Errorf("%s maps to PATH %q, want it to start with %q", ref, im.Env["PATH"], want)
		}
		if im.Files["/opt/etjob"] != "/repo" || im.Env["PYTHONPATH"] != "/opt/etjob/python" {
			t.Errorf("%s maps to %+v, want the repository at /opt/etjob on PYTHONPATH", ref, im)
		}
	}
}

// TestVenvsMatchTheirScripts: the venvs the local cluster looks for are the
// ones hack/install-horovod.sh and hack/install-torch2.sh install (their
// VERSION and their directory under etjob's cache), so that a version bumped
// in one place alone fails here instead of the local cluster running the
// wrong torch.
func TestVenvsMatchTheirScripts(t *testing.T) {
	for _, c := range []struct{ script, dir, version string }{
		{"install-horovod.sh", "horovod", HorovodVersion},
		{"install-torch2.sh", "torch2", Torch2Version},
	} {
		b, err := os.ReadFile(filepath.Join("..", "..", "hack", c.script))
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		for _, want := range []string{"\nVERSION=" + c.version + "\n", "/.cache/etjob}/" + c.dir + "\n", "\nVENV=$CACHE/venv-$VERSION\n"} {
			if !strings.Contains(text, want) {
				t.Errorf("hack/%s has no line %q: the local cluster looks for %s", c.script, strings.TrimSpace(want),
					filepath.Join(c.dir, "venv-"+c.version))
			}
		}
	}
}

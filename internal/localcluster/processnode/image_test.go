package processnode

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestImagesLookup(t *testing.T) {
	table := Images{
		{Image: "*", Env: map[string]string{"PATH": "/any"}},
		{Image: "registry.example.com/ml/*", Env: map[string]string{"PATH": "/ml"}},
		{Image: "registry.example.com/ml/horovod:*", Env: map[string]string{"PATH": "/hvd"}},
		{Image: "plain:1", Env: map[string]string{"PATH": "/plain"}},
	}
	cases := map[string]string{
		"plain:1":                              "/plain",
		"registry.example.com/ml/horovod:0.28": "/hvd",
		"registry.example.com/ml/torch:2":      "/ml",
		"python:3.11":                          "/any",
	}
	for ref, want := range cases {
		im, ok := table.Lookup(ref)
		if !ok || im.Env["PATH"] != want {
			t.Errorf("Lookup(%q) = %v, %v; want PATH %s", ref, im.Env, ok, want)
		}
	}
	if _, ok := (Images{{Image: "a"}}).Lookup("b"); ok {
		t.Error("an image no entry matches must run the host as it is")
	}
}

func TestImagesRoundTripAndMounts(t *testing.T) {
	path := filepath.Join(t.TempDir(), "images.json")
	want := Images{{Image: "*", Env: map[string]string{"PYTHONPATH": "/opt/etjob/python"},
		Files: map[string]string{"/opt/etjob": "/repo", "/examples": "/repo/examples"}}}
	if err := WriteImages(path, want); err != nil {
		t.Fatal(err)
	}
	got, err := ReadImages(path)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
	m := got[0].mounts()
	if len(m) != 2 || m[0].target != "/examples" || !m[0].readOnly || m[1].target != "/opt/etjob" {
		t.Errorf("mounts %+v: want both read-only, sorted by path", m)
	}
	if err := WriteImages(path, Images{{Image: "x", Files: map[string]string{"relative": "/a"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadImages(path); err == nil {
		t.Error("a relative container path must be refused")
	}
}

// TestWriteImagesWhileRead rewrites the table while a reader reads it, as the
// local cluster does when it starts node after node: every read sees a whole
// table (os.WriteFile's truncate-then-write let a starting node read an
// empty file and never become Ready).
func TestWriteImagesWhileRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "images.json")
	table := Images{{Image: "*", Env: map[string]string{"PATH": strings.Repeat("/x", 4096)}}}
	if err := WriteImages(path, table); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 300 {
			if err := WriteImages(path, table); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for reads := 0; ; reads++ {
		select {
		case <-done:
			return
		default:
		}
		if _, err := ReadImages(path); err != nil {
			t.Fatalf("read %d while the table was rewritten: %v", reads, err)
		}
	}
}
